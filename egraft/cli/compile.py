"""``egraft compile``: search the fastest program for a device, print the report, save the artifact.

The model and its example inputs come from the MODEL argument (see
:mod:`egraft.cli.common`); ``egraft.compile`` traces it, searches within the
budget and checks the chosen program against the model in eager PyTorch
(a wrong program is an error, never saved).  The report (what was searched,
chosen and measured; ``--compare`` says against what) is printed, and
``CompiledModel.save`` writes the artifact with the report in its manifest.
"""

from __future__ import annotations

import os

from ..errors import EgraftError
from .common import load_model, step
from .trace import add_model_args

EXAMPLES = """examples:
  egraft compile gated_mlp --device cpu --budget 30s -o out/gated_mlp
  egraft compile mymodels:build --input 1x128:int64 --int-high 50257 --device cuda -o out/gpt
  egraft compile path/to/model.py:build --input 2x8x64:float32 --fitness model --trials 20 -o out/m

The factory may return (model, example_inputs); then --input is optional."""

FITNESSES = ("measured", "model")
COMPARE = {"all": True, "eager": "eager", "none": False}  # --compare -> egraft.compile(compare=...)


def parse_budget(text: str | None, trials: int | None):
    """None (the search's default), or a search Budget from '60s' / '2m' / '45' and an optional trial cap."""
    if text is None and trials is None:
        return None
    from dataclasses import replace

    from ..search import Budget

    try:
        plan = Budget.of(text)
    except (TypeError, ValueError):
        plan = None
    if plan is None or (plan.seconds is not None and plan.seconds <= 0):
        raise EgraftError(f"bad --budget {text!r}: write a positive time, e.g. 60s, 2m or 45 (seconds)")
    if trials is not None:
        if trials < 1:
            raise EgraftError(f"--trials must be at least 1, got {trials}")
        plan = replace(plan, trials=trials)
    return plan


def compile_model(args, model, inputs):
    """egraft.compile with the command line's options (shared with ``egraft bench``)."""
    from .. import compile as egraft_compile

    opts = {"seed": args.seed}
    if getattr(args, "fitness", None):
        opts["fitness"] = args.fitness
    if getattr(args, "no_cache", False):
        opts["cache"] = False
    # what the report times against; bench does its own timing, so it passes none
    opts["compare"] = COMPARE[getattr(args, "compare", "none")]
    budget = parse_budget(args.budget, getattr(args, "trials", None))
    # no spinner here: the search draws its own progress bar on a terminal, and two live displays garble
    with step(f"compiled for {args.device}", spinner=False):
        return egraft_compile(model, device=args.device, example_inputs=inputs, backend=args.backend,
                              budget=budget, **opts)


def cmd_compile(args) -> int:
    from ..runtime.manifest import is_artifact

    out = args.output
    # the rule CompiledModel.save applies, checked before the search rather than after it
    if os.path.exists(out) and not os.path.isdir(out):
        raise EgraftError(f"-o {out}: is a file; an artifact is saved as a directory")
    if os.path.isdir(out) and os.listdir(out) and not is_artifact(out):
        raise EgraftError(f"-o {out}: a non-empty directory that does not hold an egraft artifact; choose another "
                          "(an existing artifact is overwritten)")
    model, inputs = load_model(args.model, args.input, args.seed, args.int_high)
    cm = compile_model(args, model, inputs)
    print(cm.report())
    path = cm.save(out)
    print(f"saved the artifact to {path}; `egraft inspect {path}` shows it, `egraft run {path}` runs it")
    return 0


def add_search_args(p) -> None:
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or tpu (default cpu)")
    p.add_argument("--backend", default="auto", help="auto (the search chooses), jax, torch or triton")
    p.add_argument("--budget", default=None, metavar="TIME",
                   help="search time, e.g. 60s, 2m or 45 (seconds); default: the search's own (30 s)")
    p.add_argument("--trials", type=int, default=None, metavar="N",
                   help="also stop the search after N distinct candidates")
    p.add_argument("--fitness", choices=FITNESSES, default=None,
                   help="measured: time candidates on the device (default where it exists); model: the roofline "
                        "cost model, no timing (fast; the default for an absent device)")
    p.add_argument("--no-cache", action="store_true", help="search again even if a cached result exists")


def add_parsers(sub, formatter, parents) -> None:
    p = sub.add_parser("compile", help="search the fastest program for a device and save the artifact",
                       formatter_class=formatter, parents=parents, epilog=EXAMPLES,
                       description="Trace the model, search the programs equal to it for the fastest on the "
                                   "device, check the result against eager PyTorch, print the search report and "
                                   "save the artifact directory (egraft inspect / egraft run / egraft.load).")
    add_model_args(p)
    add_search_args(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="artifact directory to write (new, empty, or an artifact to overwrite)")
    p.add_argument("--compare", choices=list(COMPARE), default="all",
                   help="what the report times the result against: all (eager PyTorch and torch.compile, the "
                        "default), eager, or none")
    p.set_defaults(fn=cmd_compile)
