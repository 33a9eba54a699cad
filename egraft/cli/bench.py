"""``egraft bench``: egraft against torch eager and torch.compile (Inductor), measured so the numbers compare.

The protocol (the one ``egraft.measure.timing`` and the search's final
comparison use):

* fixed cores and threads (``egraft.measure.pinned``, the one pinning
  context): the process is pinned to ``--threads`` cores (XLA sizes its
  pools to them) and torch runs that many threads, set before torch or JAX
  start their pools where this process has not loaded them yet, and undone
  afterwards;
* every variant is checked against eager PyTorch first: a wrong program is
  not timed;
* warm-up calls absorb compilation (Inductor's compile time is reported on
  its own line);
* the variants are timed interleaved, round by round in a rotating order
  (``--calls`` timed calls per variant each round, after one untimed call in the
  first round and, later, for variants faster than 10 ms; ``egraft.measure.interleaved``), so every variant sees the
  same machine state; the table shows medians over all rounds and their
  relative spread ((p90 - p10) / median);
* a speed-up is concluded only as ``egraft.compile``'s report concludes one
  (``egraft.measure.compare``): the medians' ~95 % intervals apart and no
  spread above 50 %; otherwise the table says why not, with a warning that
  the machine was too noisy.

``egraft bench MODEL`` compiles the model first (same options as ``egraft
compile``); ``egraft bench DIR --check MODEL`` times a saved artifact against
the model it was compiled from.
"""

from __future__ import annotations

import os
import sys

from ..errors import EgraftError
from .common import compare_outputs, load_model, run_model, step
from .compile import add_search_args, compile_model
from .trace import add_model_args

EXAMPLES = """examples:
  egraft bench gated_mlp --budget 30s --threads 1 --rounds 20
  egraft bench mymodels:build --input 4x128:int64 --threads 2
  egraft bench out/gated_mlp --check gated_mlp --threads 1

A speed-up is concluded only when the medians' 95 % intervals do not overlap and no spread is
above 50 %; otherwise the table says the machine was too noisy: run again when it is quiet."""


def _variants(args, model, inputs) -> tuple[dict, str, list[str] | None]:
    """({name: callable}, the egraft variant's name, None or the lines of a mismatch with eager PyTorch).

    Eager first, then torch.compile (compiled and warmed up here), then egraft:
    a saved artifact, or the model compiled now under the pinned conditions
    (the search then times candidates the way they will be timed here).
    """
    import torch

    want = run_model(model, inputs, args.int_high)
    variants = {"torch eager": model}
    if not args.no_inductor:
        compiled = torch.compile(model)
        try:
            with torch.no_grad(), step("torch.compile (Inductor) warm-up"):
                compiled(*inputs)
                compiled(*inputs)
            variants["torch.compile"] = compiled
        except Exception as e:  # noqa: BLE001 - Inductor failing on this model is a result to show, not a crash
            print(f"torch.compile failed on this model, left out: {type(e).__name__}: {str(e).splitlines()[0]}")
    if os.path.isdir(args.target):
        from .. import load

        mine = load(args.target, device=args.device)
        label = f"egraft ({mine.backend})"
    else:
        mine = compile_model(args, model, inputs)
        label = f"egraft ({', '.join(sorted({r.backend for r in mine.results.values()}))})"
    with torch.no_grad():
        ok, lines = compare_outputs(mine(*inputs), want)
    variants[label] = mine
    return variants, label, None if ok else lines


def time_interleaved(variants: dict, inputs, device: str, rounds: int, calls: int) -> dict:
    """{name: Timing} from `rounds` rotating rounds of `calls` timed calls per variant (``measure.interleaved``'s warm-ups)."""
    import torch

    from ..measure import interleaved

    with torch.no_grad():
        return interleaved({k: (lambda fn=fn: fn(*inputs)) for k, fn in variants.items()}, device, rounds, calls)


def table(timings: dict, label: str) -> str:
    """Medians and spreads per variant, then egraft's speed-up over each other one and whether it is conclusive."""
    from ..measure import compare

    lines = [f"{'variant':<24}{'median':>12}{'spread':>9}", "-" * 45]
    for name, t in timings.items():
        lines.append(f"{name:<24}{t.median * 1e3:>10.3f}ms{'±' + format(t.spread, '.1%'):>9}")
    lines.append("")
    noisy = False
    for name, t in timings.items():
        if name == label:
            continue
        v = compare(timings[label], t)
        speedup = v["speedup"] if v["speedup"] is not None else float("nan")
        ci = f"95 % interval {v['interval'][0]:.2f}-{v['interval'][1]:.2f}x"
        if v["conclusive"]:
            lines.append(f"{label} vs {name}: {speedup:.2f}x ({'faster' if speedup >= 1 else 'SLOWER'}; {ci})")
        else:
            noisy = True
            lines.append(f"{label} vs {name}: {speedup:.2f}x ({ci}), not conclusive ({v['why_not']})")
    if noisy:
        lines.append("WARNING: the machine was too noisy to conclude every comparison; run again when it is quiet")
    return "\n".join(lines)


def cmd_bench(args) -> int:
    if args.rounds < 1 or args.calls < 1:
        raise EgraftError("--rounds and --calls must be at least 1")
    is_dir = os.path.isdir(args.target)
    if is_dir and not args.check:
        raise EgraftError(f"bench of the artifact {args.target} needs --check MODEL: the model it was compiled "
                          "from, to time torch against")
    if not is_dir and args.check:
        raise EgraftError("--check names the model of an artifact DIR; with a MODEL, bench compiles it itself")
    from ..measure import pinned

    if args.threads < 1:
        raise EgraftError(f"--threads must be at least 1, got {args.threads}")
    with pinned("cpu", args.threads):  # the host process: its cores and threads, for every device
        if is_dir:
            from .run import artifact_inputs

            model, _ = load_model(args.check, (), args.seed, args.int_high, need_inputs=False)
            inputs = artifact_inputs(args.target, args.device, args.input, args.seed, args.int_high)
        else:
            model, inputs = load_model(args.target, args.input, args.seed, args.int_high)
        model, inputs = _on_device(model, inputs, args.device)
        variants, label, mismatch = _variants(args, model, inputs)
        if mismatch:
            print("\n".join("  " + line for line in mismatch))
            print("egraft: error: egraft's outputs differ from eager PyTorch's; not timing a wrong program",
                  file=sys.stderr)
            return 1
        threads, cores = _conditions()
        print(f"\n{args.rounds} rounds x {args.calls} calls per variant, interleaved; device {args.device}, "
              f"{threads} thread(s) on cores {list(cores)}; inputs {[tuple(x.shape) for x in inputs]}")
        print(table(time_interleaved(variants, inputs, args.device, args.rounds, args.calls), label))
    return 0


def _conditions():
    import torch

    from ..measure.timing import conditions

    return torch.get_num_threads(), conditions()[1]


def _on_device(model, inputs, device: str):
    from ..measure import parse

    if parse(device).kind == "cpu":
        return model, inputs
    return model.to(device), tuple(x.to(device) for x in inputs)


def add_parsers(verb) -> None:
    p = verb("bench", cmd_bench, help="time egraft against torch eager and torch.compile", epilog=EXAMPLES,
             description="Time egraft (a model compiled now, or a saved artifact DIR) against torch "
                         "eager and torch.compile (Inductor): fixed cores and threads, interleaved "
                         "calls, medians with their relative spread.")
    add_model_args(p, positional="target", metavar="MODEL|DIR",
                   help="the model to compile and time (as for egraft compile), or an artifact directory")
    p.add_argument("--check", metavar="MODEL", default=None,
                   help="with an artifact DIR: the model it was compiled from (same --seed)")
    add_search_args(p)
    p.add_argument("--threads", type=int, default=1, metavar="N", help="pin to N cores, N threads (default 1)")
    p.add_argument("--rounds", type=int, default=20, metavar="N", help="interleaved rounds (default 20)")
    p.add_argument("--calls", type=int, default=3, metavar="N", help="timed calls per variant per round (default 3)")
    p.add_argument("--no-inductor", action="store_true", help="leave torch.compile out (its compile takes a while)")
