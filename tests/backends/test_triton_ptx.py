"""Triton kernels cross-compile for sm_90 and sm_80, without a GPU.

The interpreter accepts kernels a GPU would reject (tl.dot tile minimums,
non-power-of-two ranges, ...).  The kernels of every conformance case, of a
fixed graph of fused forms under several knob settings, and of the tiny
``egraft.models`` workloads are generated here, explicitly, and compiled with
``triton.compile(ASTSource(...), target=GPUTarget('cuda', arch, 32))`` in a
subprocess without TRITON_INTERPRET.  Nothing depends on which other tests
ran before.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import pytest
from conformance import all_cases
from triton_helpers import DEVICE, require_mode

from egraft.backends import lower
from egraft.backends.triton import generate_kernels
from egraft.backends.triton.ptx import compile_in_subprocess
from egraft.ir import GraphBuilder

KNOB_SETS = [
    {},
    {"matmul_block": (128, 128, 32), "attention_block": (16, 16)},
    {"fuse_epilogue": False, "persistent_rows": False},
    {"fuse_prologue": False, "tile_elems": 512, "num_warps": 2},
    {"matmul_block": (16, 16, 16), "num_stages": 3, "tile_elems": 8192},
]


def _own_graph():
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
        # an outer product (K = 1) of a weight and positions computed in the kernel: a rotary embedding's frequencies
        (b.input("u", (8,), "float32").reshape((1, 8, 1)) @ b.input("t", (1, 1, 6), "int64").cast("float32")).sin(),
        *_quantised_products(b),
    ]
    return b.build(outs)


def _quantised_products(b):
    """Dequantise-and-dot as egraft.frontend.quantize's layers trace: int8 per output channel, int4 in groups."""
    x = b.input("xq", (3, 64), "float32")
    q8, s8 = b.input("q8", (48, 64), "int8"), b.input("s8", (48,), "float32")
    q4, s4 = b.input("q4", (48, 32), "int8"), b.input("s4", (48, 2), "float32")
    w4 = (q4.unpack_int4().cast("float32").reshape((48, 2, 32)) * s4.reshape((48, 2, 1)).expand((48, 2, 32)))
    return [(x @ q8.cast("float32").T) * s8.reshape((1, 48)).expand((3, 48)), x @ w4.reshape((48, 64)).T]


def _model_graphs():
    import egraft
    from egraft.models import MODELS

    for name in sorted(MODELS):
        spec = MODELS[name]
        model = spec.build("tiny", seed=0)
        args = spec.example_inputs(model, batch=1 if name != "mlp" else 2, seq=4, seed=0)
        yield egraft.trace(model, args)


def _kernels(source):
    if source == "conformance":
        return [k for c in all_cases() for k in generate_kernels(c.graph())]
    if source == "fused_knobs":
        return [k for kn in KNOB_SETS for k in generate_kernels(_own_graph(), kn)]
    return [k for g in _model_graphs() for k in generate_kernels(g)]


@pytest.mark.parametrize("arch", [90, 80])
@pytest.mark.parametrize("source", ["conformance", "fused_knobs", "models"])
def test_generated_kernels_compile_for_the_gpu(source, arch):
    require_mode()
    failures = compile_in_subprocess(_kernels(source), archs=(arch,))
    assert not failures, "\n\n".join(failures)


def test_ptx_check_rejects_a_kernel_a_gpu_cannot_compile():
    require_mode()
    k = generate_kernels(_own_graph())[0]
    bad_src = k.source.replace("tl.program_id(0)", "tl.program_id(0) + tl.arange(0, 3)[0]")
    path = os.path.join(tempfile.mkdtemp(), "bad_kernel.py")
    with open(path, "w") as f:
        f.write(bad_src)
    bad = dataclasses.replace(k, source=bad_src, path=path)
    failures = compile_in_subprocess([bad], archs=(90,))
    assert failures, "a kernel with a non-power-of-two tl.arange must fail to compile"


@pytest.mark.host_specific
@pytest.mark.skipif(DEVICE != "cpu", reason="checks the refusal under TRITON_INTERPRET (CPU hosts); on a CUDA host "
                    "in-process compilation itself is checked by bench/gpu_check.py")
def test_in_process_compile_refuses_under_the_interpreter():
    from egraft.backends.triton.ptx import compile_to_ptx
    from egraft.errors import BackendError

    ex = lower(_own_graph(), "triton", DEVICE)
    with pytest.raises(BackendError, match="subprocess"):
        compile_to_ptx(ex.kernels[0], 90)
