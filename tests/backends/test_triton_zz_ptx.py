"""Every Triton kernel generated in this test session cross-compiles for sm_90 and sm_80.

The interpreter accepts kernels a GPU would reject (tl.dot tile minimums,
non-power-of-two ranges, ...): each generated kernel is compiled with
``triton.compile(ASTSource(...), target=GPUTarget('cuda', arch, 32))`` in a
subprocess without TRITON_INTERPRET.  This module is named to run after the
other Triton test modules and compiles everything they generated (the
process-wide registry ``egraft.backends.triton.GENERATED``) plus a fixed set
of graphs of its own, so it is meaningful when run alone too.
"""

from __future__ import annotations

import dataclasses

import pytest
from triton_helpers import DEVICE, require_mode

from egraft.backends import lower
from egraft.backends.triton import GENERATED
from egraft.backends.triton.ptx import compile_in_subprocess
from egraft.ir import GraphBuilder


def _own_graphs():
    b = GraphBuilder()
    x = b.input("x", (2, 6, 24), "float32")
    w = b.input("w", (40, 24), "float32")
    h = b.input("h", (3, 5, 16), "float16")
    q = b.input("q", (1, 2, 5, 16), "float32")
    k = b.input("k", (1, 2, 9, 16), "float32")
    i = b.input("i", (2, 6, 3), "int64")
    p = b.input("p", (2, 6, 24), "bool")
    outs = [
        (x.layer_norm(1e-5).matmul(w.T)).gelu("tanh"),
        x.softmax(-1), x.rms_norm(1e-6), x.sum(1), x.max(0),
        h.softmax(-1), h.matmul(h.transpose(1, 2)),
        b.add("Attention", (q, k, k), scale=0.25, causal=True),
        b.add("Attention", (q, k, k, b.input("bias", (1, 2, 5, 9), "float32")), scale=0.25, causal=False),
        x.gather(2, i.maximum(0).minimum(23)), (p & (x > 0)).any(2), x.flip(2) % 0.5,
    ]
    return b.build(outs)


def test_all_generated_kernels_compile_for_sm90_and_sm80():
    require_mode()
    lower(_own_graphs(), "triton", DEVICE)
    lower(_own_graphs(), "triton", DEVICE, {"matmul_block": (128, 128, 32), "attention_block": (16, 16)})
    failures = compile_in_subprocess(list(GENERATED), archs=(90, 80))
    assert not failures, "\n\n".join(failures)


def test_ptx_check_rejects_a_kernel_a_gpu_cannot_compile():
    require_mode()
    ex = lower(_own_graphs(), "triton", DEVICE)
    k = ex.kernels[0]
    bad_src = k.source.replace("tl.program_id(0)", "tl.program_id(0) + tl.arange(0, 3)[0]")
    import os
    import tempfile

    d = tempfile.mkdtemp()
    path = os.path.join(d, "bad_kernel.py")
    with open(path, "w") as f:
        f.write(bad_src)
    bad = dataclasses.replace(k, source=bad_src, path=path)
    failures = compile_in_subprocess([bad], archs=(90,))
    assert failures, "a kernel with a non-power-of-two tl.arange must fail to compile"


@pytest.mark.skipif(DEVICE != "cpu", reason="in-process compile is tested on the GPU machine by gpu_check")
def test_in_process_compile_refuses_under_the_interpreter():
    from egraft.backends.triton.ptx import compile_to_ptx
    from egraft.errors import BackendError

    ex = lower(_own_graphs(), "triton", DEVICE)
    with pytest.raises(BackendError, match="subprocess"):
        compile_to_ptx(ex.kernels[0], 90)
