"""``egraft run``: call a saved artifact on random (or given) inputs, optionally checked against the model.

The artifact is loaded with ``egraft.load`` (which verifies its manifest and
checksums); inputs are drawn to match the manifest's input shapes and dtypes
(integers in ``[0, --int-high)``), or given as ``--input SHAPE:DTYPE`` specs
or ``--input-file x.npy`` arrays, one per model input in order.  With
``--check MODEL`` the model is built (same ``--seed`` as at compile time) and
its outputs compared with the artifact's, float outputs to the dtype's
model-level tolerance, the others exactly; a mismatch exits with status 1.
"""

from __future__ import annotations

import sys

from ..errors import EgraftError
from .common import (compare_outputs, dtype_name, inputs_from_specs, leaves, load_model, run_model,
                     shape_text, to_numpy)

EXAMPLES = """examples:
  egraft run out/gated_mlp
  egraft run out/gated_mlp --check gated_mlp --repeat 50
  egraft run out/gpt --input-file ids.npy --check mymodels:build
  egraft run out/m --input 4x8x64:float32 --device cuda"""


def input_pairs(art) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each input the artifact takes, in order."""
    return [(s.shape, s.dtype) for s in art.input_specs]


def load_artifact(directory: str, device: str = "cpu"):
    from .. import load
    from ..errors import InputError

    art = load(directory, device=device)  # a missing, tampered or too-new artifact: ArtifactError, one line
    if not hasattr(art, "input_specs"):  # a saved generation: a dozen programs and their caches, not one call
        raise InputError(f"{directory!r} holds a saved generation, which `egraft run` does not call: generate with "
                         f"egraft.load({directory!r}).generate(input_ids, max_new_tokens=...) (or inspect it with "
                         "`egraft inspect`)")
    return art


def _read_files(paths) -> tuple:
    import numpy as np
    import torch

    out = []
    for p in paths:
        try:
            a = np.load(p, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise EgraftError(f"--input-file {p}: cannot read it as a .npy array ({e})") from None
        out.append(torch.from_numpy(np.ascontiguousarray(a)))
    return tuple(out)


def artifact_inputs(art_or_dir, device: str, specs=(), seed: int = 0, int_high: int = 100, files=()) -> tuple:
    """The inputs to call an artifact with: files, specs, or random ones matching its manifest."""
    art = load_artifact(art_or_dir, device) if isinstance(art_or_dir, str) else art_or_dir
    want = input_pairs(art)
    if files and specs:
        raise EgraftError("pass either --input or --input-file, not both")
    if files:
        xs = _read_files(files)
    elif specs:
        xs = inputs_from_specs(specs, seed, int_high)
    else:
        xs = inputs_from_specs(want, seed, int_high)
    if len(xs) != len(want):
        takes = ", ".join(f"{shape_text(s)}:{d}" for s, d in want)
        raise EgraftError(f"the artifact takes {len(want)} inputs ({takes}), got {len(xs)}")
    from ..measure import parse

    return xs if parse(device).kind == "cpu" else tuple(x.to(device) for x in xs)


def describe_output(k: int, x) -> str:
    a = to_numpy(x)
    head = f"output {k}: {shape_text(a.shape)}:{dtype_name(x)}"
    if a.size == 0:
        return head + "  (empty)"
    if a.dtype.kind == "f":
        return head + f"  mean {a.mean():.4g}  std {a.std():.4g}  min {a.min():.4g}  max {a.max():.4g}"
    return head + f"  min {a.min()}  max {a.max()}"


DESCRIPTION = ("Load an artifact with egraft.load (manifest and checksums verified), call it on random inputs "
               "matching its manifest (or the given ones), print the outputs' shapes, dtypes and a summary; "
               "--check compares with the model.")


def cmd_run(args) -> int:
    art = load_artifact(args.dir, args.device)
    inputs = artifact_inputs(art, args.device, args.input, args.seed, args.int_high, args.input_file)
    print(f"inputs: {', '.join(shape_text(x.shape) + ':' + dtype_name(x) for x in inputs)}")
    got = art(*inputs)
    for k, x in enumerate(leaves(got)):
        print(describe_output(k, x))
    if args.repeat:
        from ..measure import COLLAPSE, median_interval, parse, time

        kw = {} if parse(args.device).kind == "cuda" else {"warmup": 1, "repeats": args.repeat}
        t = time(lambda: art(*inputs), args.device, **kw)
        lo, hi = median_interval(t)
        note = (f"  (spread above {COLLAPSE:.0%}: the machine is too busy to trust this)"
                if t.spread > COLLAPSE else "")
        print(f"time per call: {t.median * 1e3:.3f} ms median of {t.n} ±{t.spread:.0%} "
              f"(95 % interval of the median {lo * 1e3:.3f}-{hi * 1e3:.3f} ms){note}")
    if args.check:
        from ..measure import parse

        model, _ = load_model(args.check, (), args.seed, args.int_high, need_inputs=False)
        if parse(args.device).kind != "cpu":
            model = model.to(args.device)
        want = run_model(model, inputs, args.int_high)
        ok, lines = compare_outputs(got, want)
        print(f"check against {args.check} (eager PyTorch):")
        for line in lines:
            print("  " + line)
        if not ok:
            print("egraft: error: the artifact's outputs differ from the model's", file=sys.stderr)
            return 1
        print("  outputs match")
    return 0


def add_parsers(verb) -> None:
    from .common import INT_HIGH

    p = verb("run", cmd_run, help="run a saved artifact (and check it against the model)", epilog=EXAMPLES,
             description=DESCRIPTION, artifact_dir=True)
    p.add_argument("--input", action="append", default=[], metavar="SHAPE:DTYPE",
                   help="random input of this shape and dtype instead of the manifest's (repeat per input)")
    p.add_argument("--input-file", action="append", default=[], metavar="X.npy",
                   help="an input read from a .npy file (repeat per input, in order)")
    p.add_argument("--check", metavar="MODEL", default=None,
                   help="compare with this model's outputs (workload name or module:factory; same --seed as compile)")
    p.add_argument("--device", default="cpu", help="device to run on (default cpu)")
    p.add_argument("--repeat", type=int, default=0, metavar="N", help="time N calls; print the median per call")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and of the --check model")
    p.add_argument("--int-high", type=int, default=INT_HIGH, metavar="N",
                   help=f"random integer inputs are drawn from [0, N) (default {INT_HIGH})")
