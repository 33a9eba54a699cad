"""egraft's dependencies from pyproject.toml, one per line, less torch: for a venv that keeps its own torch
(the vLLM and llama.cpp environments of the Makefile)."""

import os
import tomllib

with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml"), "rb") as f:
    print("\n".join(d for d in tomllib.load(f)["project"]["dependencies"] if not d.startswith("torch")))
