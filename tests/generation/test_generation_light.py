"""The generation loop and the session are light: importing them loads no transformers, compiler or tracer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ["transformers", "egglog", "deap", "jax", "triton", "egraft.frontend", "egraft.search", "egraft.rewrites",
         "egraft.backends", "egraft.api"]


def test_generation_runtime_imports_no_compiler():
    code = ("import json, sys; import egraft.runtime.generation, egraft.runtime.slots, egraft.runtime.sampling; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
