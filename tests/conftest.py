"""Suite-wide setup.

Triton reads TRITON_INTERPRET when it is first imported, so it is set here,
before any test module imports triton: without a GPU, Triton kernels run
under the interpreter.  On a GPU machine, `EGRAFT_TEST_DEVICE=cuda` keeps
real GPU execution (bench/gpu_check.py sets it).
"""

import os

if os.environ.get("EGRAFT_TEST_DEVICE", "cpu") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")
