"""The egraft command line, end to end: compile your own model to an artifact, inspect it, run and check it.

    python examples/cli_roundtrip.py           # 20 s of search
    python examples/cli_roundtrip.py --small   # the cost model and a few candidates (seconds)

Each command is printed before it runs; they are what you would type in a
shell.  The model is this file's ``build`` factory: ``egraft`` accepts
``path/to/file.py:factory`` (or ``package.module:factory``, or a workload
name from ``egraft models``).  The factory is called after
``torch.manual_seed(--seed)``, so ``compile`` and ``run --check`` build the
same weights.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile

import torch
from torch import nn


class Classifier(nn.Module):
    """A user model: LayerNorm, a GELU MLP and a softmax over 10 classes."""

    def __init__(self, d: int = 128, hidden: int = 512, classes: int = 10):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, hidden), nn.Linear(hidden, classes)

    def forward(self, x):
        return torch.softmax(self.down(nn.functional.gelu(self.up(self.norm(x)))), dim=-1)


def build() -> nn.Module:
    """The factory egraft calls (it may also return ``(model, example_inputs)``; then --input is optional)."""
    return Classifier()


def egraft(*args: str) -> None:
    """Run `egraft ARGS` (as ``python -m egraft.cli``, the same command), showing it first; stop on a failure."""
    print(f"\n$ egraft {shlex.join(args)}", flush=True)
    rc = subprocess.run([sys.executable, "-m", "egraft.cli", *args]).returncode
    if rc != 0:
        raise SystemExit(f"egraft {args[0]} exited with status {rc}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="20s", help="search time (e.g. 20s, 1m)")
    ap.add_argument("--out", default=None, help="artifact directory (default: a new temporary directory)")
    ap.add_argument("--small", action="store_true", help="rank a few candidates by the cost model; no timing")
    args = ap.parse_args(argv)

    model = f"{os.path.relpath(__file__)}:build"
    out = args.out or tempfile.mkdtemp(prefix="egraft-cli-")
    search = (["--fitness", "model", "--trials", "3", "--compare", "none"] if args.small
              else ["--budget", args.budget, "--compare", "eager"])

    # 1. search the fastest program for this CPU, check it against the model, print the report, save it
    egraft("compile", model, "--input", "32x128:float32", "--device", "cpu", *search, "-o", out)
    # 2. what the artifact holds (every file is checked against its recorded SHA-256 first)
    egraft("inspect", out)
    # 3. load it with egraft.load, run it on random inputs and compare with the model built again
    egraft("run", out, "--check", model, "--repeat", "20")
    print(f"\nthe artifact is in {out}; in Python: egraft.load({out!r})(x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
