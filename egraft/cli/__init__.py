"""The `egraft` command line (console script ``egraft``, or ``python -m egraft.cli``).

Verbs, one module each (``egraft VERB --help`` shows examples; docs/cli.md
has them all):

* ``egraft models`` — list the reference workloads in ``egraft.models``.
* ``egraft trace MODEL`` — lower a model to the IR, print its summary;
  ``--check`` compares the IR's reference evaluation with eager PyTorch.
* ``egraft compile MODEL --input SHAPE:DTYPE ... --device D -o DIR`` — search
  the fastest program for the device, print the search report, save the
  artifact.
* ``egraft inspect DIR`` — what an artifact holds, its checksums verified.
* ``egraft run DIR`` — run an artifact on random (or given) inputs;
  ``--check MODEL`` compares its outputs with the model's.
* ``egraft bench MODEL|DIR`` — egraft against torch eager and torch.compile,
  timed interleaved under fixed cores and threads.

MODEL is a workload name from ``egraft models``, ``package.module:factory``
or ``path/to/file.py:factory`` (a callable returning the ``nn.Module``, or
``(module, example_inputs)``).

Exit codes: 0 success; 1 a check found different outputs; 2 an error egraft
can name (bad arguments, unknown model, unsupported op, missing or tampered
artifact), printed as one line ``egraft: error: ...``; 3 an unexpected
exception (a bug: ``--debug`` shows its traceback); 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import EgraftError
from .common import load_model, parse_input_spec

__all__ = ["build_parser", "load_model", "main", "parse_input_spec"]

EXIT_MISMATCH, EXIT_ERROR, EXIT_BUG, EXIT_INTERRUPTED = 1, 2, 3, 130


class UsageError(EgraftError):
    """Bad command-line arguments (argparse's complaint, turned into egraft's one-line error)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage and exits; we want one line and a return code
        raise UsageError(f"{message} (`{self.prog} --help` shows the usage)")


def _one_line(msg: str) -> str:
    return " ".join(part.strip() for part in str(msg).splitlines() if part.strip())


def build_parser() -> argparse.ArgumentParser:
    from . import bench, compile, inspect, run, trace

    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(prog="egraft", description="egraft: an equality-saturation tensor compiler for PyTorch models.",
                epilog=_EXAMPLES, formatter_class=fmt)
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB", parser_class=_Parser)
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback of an error")
    def verb(name: str, fn, help: str, description: str, epilog: str,  # noqa: A002
             artifact_dir: bool = False) -> argparse.ArgumentParser:
        """One verb's parser: the help formatter and --debug shared by all; `fn(args)` runs it; with
        `artifact_dir` its first argument is the artifact directory it reads (``inspect``, ``run``)."""
        v = sub.add_parser(name, help=help, description=description, epilog=epilog, formatter_class=fmt,
                           parents=[debug])
        if artifact_dir:
            v.add_argument("dir", metavar="DIR", help="artifact directory (egraft compile -o DIR)")
        v.set_defaults(fn=fn)
        return v

    for module in (trace, compile, inspect, run, bench):
        module.add_parsers(verb)
    return p


_EXAMPLES = """examples:
  egraft models
  egraft trace gated_mlp --check
  egraft compile mymodels:build --input 1x128:int64 --device cpu --budget 60s -o out/
  egraft inspect out/
  egraft run out/ --check mymodels:build
  egraft bench gated_mlp --budget 30s --threads 1

exit codes: 0 ok, 1 outputs differ (--check), 2 error (one line: egraft: error: ...),
            3 unexpected exception (rerun with --debug), 130 interrupted"""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # --help, or argparse's own exit
            return int(e.code or 0) if not isinstance(e.code, str) else EXIT_ERROR
        return int(args.fn(args) or 0)
    except EgraftError as e:
        if debug:
            raise
        print(f"egraft: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        if debug:
            raise
        print("egraft: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - a bug: one line unless --debug, and say how to see more
        if debug:
            raise
        print(f"egraft: error: unexpected {type(e).__name__}: {_one_line(e)} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_BUG
