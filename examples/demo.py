"""egraft demo: compile a GPT-2 block for this CPU, see what it gained, save it, and serve the saved artifact.

    python examples/demo.py                 # about a minute: 20 s of search, then the timings
    python examples/demo.py --out out/gpt2  # keep the artifact where you want it
    python examples/demo.py --small         # a tiny block and budget (a smoke test, seconds)

1. ``egraft.compile`` traces the block, searches the programs equal to it
   for the fastest on this CPU within the budget, and checks the winner
   against eager PyTorch (a wrong program is never returned);
2. ``cm.measure()`` times the result against eager PyTorch and
   ``torch.compile``, interleaved on one pinned core, and ``cm.report()``
   says what each stage did and took and what was measured; a speed-up
   always comes with its spread, and a machine too noisy to conclude is
   said, not hidden;
3. ``cm.save(DIR)`` writes the artifact;
4. a fresh Python process loads it with ``egraft.load`` (none of the
   compiler imported) and runs it on new inputs; the demo compares its
   outputs with the model's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from egraft.measure import fix_threads

fix_threads(1)  # one core, one thread for torch and XLA, before either starts: the measuring protocol

import numpy as np  # noqa: E402
import torch  # noqa: E402

import egraft  # noqa: E402
from egraft.models import MODELS
from egraft.search import Budget
from egraft.search.report import fmt_time

TOLERANCE = 1e-4  # max |got - want| / max |want| allowed for float32 outputs (egraft's model-level bound)

# what a serving process runs: only the light runtime, never the compiler
SERVE = """\
import sys, numpy as np, egraft
art = egraft.load(sys.argv[1])             # checks the manifest and every file's SHA-256
x, want = np.load(sys.argv[2]), np.load(sys.argv[3])
y = art(x)                                 # numpy in, numpy out (torch tensors in: torch out)
err = float(np.abs(y - want).max() / np.abs(want).max())
compiler = [m for m in ("egraft.search", "egraft.rewrites", "egraft.frontend", "egglog") if m in sys.modules]
print(f"  loaded {art!r}")
print(f"  compiler modules imported: {', '.join(compiler) or 'none'}; torch imported: {'torch' in sys.modules}")
ok = err <= float(sys.argv[4])
print(f"  max relative error against the model: {err:.1e} (allowed {sys.argv[4]}): "
      + ("same outputs" if ok else "MISMATCH"))
sys.exit(0 if ok else 1)
"""


def speedup_line(name: str, c: dict) -> str:
    """One verdict, always with both spreads; 'too noisy to conclude' when the measurement cannot carry one."""
    s, mine, theirs = c["speedups"][name], c["times"]["egraft"], c["times"][name]
    numbers = (f"egraft {fmt_time(mine['median_s'])} ±{mine['spread']:.0%}, "
               f"{name} {fmt_time(theirs['median_s'])} ±{theirs['spread']:.0%}")
    lo, hi = s["interval"]
    numbers += f"; 95 % interval of the speed-up {lo:.2f}-{hi:.2f}x"
    if s["conclusive"]:
        return f"{s['speedup']:.2f}x {'faster' if s['speedup'] >= 1 else 'SLOWER'} than {name} ({numbers})"
    return (f"{s['speedup']:.2f}x against {name} ({numbers}): too noisy to conclude ({s['why_not']}); "
            "run again on a quiet machine")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=None, help="search seconds (default 20; --small: 3)")
    ap.add_argument("--out", default=None, help="artifact directory (default: a new temporary directory)")
    ap.add_argument("--small", action="store_true", help="tiny model and budget, eager comparison only")
    ap.add_argument("--cached", action="store_true", help="reuse a cached search result for this model, if any")
    args = ap.parse_args(argv)

    # a GPT-2 block at a size where one call takes a few ms on one core (tiny for --small)
    spec = MODELS["gpt2_block"]
    hidden, batch, seq = (32, 2, 8) if args.small else (256, 4, 64)
    model = spec.build("tiny", seed=0, hidden=hidden, heads=4)
    example = spec.example_inputs(model, batch=batch, seq=seq, seed=1)
    budget = Budget(seconds=args.budget or 3, trials=6) if args.small else (args.budget or 20)
    print(f"== egraft.compile: GPT-2 block, hidden {hidden}, input {list(example[0].shape)}, search budget "
          f"{budget if isinstance(budget, (int, float)) else budget.seconds} s\n")

    # 1-2. compile (trace, search, the winner's executable, check against eager), measure, then report.
    # The search cache is off unless --cached: each run measures this machine as it is now (a cached
    # result would repeat the choice, and the search numbers, of whichever run filled the cache)
    cm = egraft.compile(model, device="cpu", example_inputs=example, budget=budget, cache=args.cached)
    cm.measure(inductor=not args.small)  # the timings run here, explicitly; the report only shows them
    print(cm.report())
    record = cm.report("json")["signatures"][0]  # the same report as a dict (reporting measures nothing)

    # 3. save the artifact
    out = cm.save(args.out or tempfile.mkdtemp(prefix="egraft-demo-"))
    print(f"\n== saved the artifact to {out}")

    # 4. a fresh process loads it and runs it on new inputs; the model's outputs are the reference
    x = spec.example_inputs(model, batch=batch, seq=seq, seed=2)[0]
    with torch.no_grad():
        want = model(x)
    print("== a fresh Python process loads it with egraft.load and runs it on new inputs:")
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "x.npy", x.numpy())
        np.save(Path(tmp) / "want.npy", want.numpy())
        run = subprocess.run([sys.executable, "-c", SERVE, out, f"{tmp}/x.npy", f"{tmp}/want.npy", str(TOLERANCE)],
                             capture_output=True, text=True)
    print(run.stdout + run.stderr, end="")
    if run.returncode != 0:
        print("the loaded artifact did not reproduce the model's outputs")
        return 1

    # the short version
    ch, c, st = record["chosen"], record["comparison"], record["stages"]
    knobs = ", ".join(f"{k}={v}" for k, v in ch["knobs"].items())
    print(f"\n== summary\n  compiled in {sum(st.values()):.1f} s (search {st['search']:.1f} s); chosen: "
          f"{ch['backend']} ({knobs})")
    for name in c["speedups"]:
        print("  " + speedup_line(name, c))
    print(f"  artifact: {out}\n"
          f"  load it:  art = egraft.load({out!r}); y = art(x)   # x: {record['signature']}\n"
          f"  or:       egraft inspect {out}    egraft run {out} --repeat 50")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
