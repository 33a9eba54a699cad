"""Quantised layers (``egraft.frontend.quantize``) as Triton kernels: the dequantise (int8 widened, int4 unpacked
through ``Nibble`` and scaled per group) fused with the product, checked against the reference interpreter (in
Triton's interpreter on the CPU here; the same kernels cross-compile for the GPU in test_triton_ptx.py)."""

from __future__ import annotations

import pytest
import torch
from triton_helpers import check, require_mode

from egraft.frontend.quantize import quantize
from egraft.testing import fresh_seed


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantised_layers_run_as_triton_kernels_and_equal_the_reference(mode):
    import egraft

    require_mode()
    torch.manual_seed(fresh_seed())
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.SiLU(), torch.nn.Linear(64, 32, bias=False)).eval()
    qm, _ = quantize(m, mode, 32 if mode == "int4" else None)
    graph = egraft.trace(qm, (torch.randn(3, 64),))
    assert any(n.op == "Nibble" for n in graph.nodes) == (mode == "int4")
    ex = check(graph)
    assert ex.sources(), "no kernel was generated"
