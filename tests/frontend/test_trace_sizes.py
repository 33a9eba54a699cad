"""One torch.export with symbolic sizes, lowered at several concrete shapes (``egraft.frontend.sizes``).

Each lowering must be the graph a torch.export at those shapes gives (same
structural hash) and compute what the model does on random inputs; sizes
outside the export's range, inputs that disagree with its fixed dims, and a
symbolic program lowered without shapes are refused with InputError.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.export import Dim

from egraft.errors import InputError
from egraft.frontend import export_program, lower_program
from egraft.frontend.sizes import SizeBinding, is_symbolic
from egraft.ir.evaluate import evaluate


class SizeDependent(torch.nn.Module):
    """Views, slices, aranges and a creation op whose sizes the model computes from its inputs' shapes."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, mask):  # x [2, T, 8], mask [2, C]
        b, t, _ = x.shape
        h = self.lin(x).reshape(b, t, 2, 4).transpose(1, 2)  # [b, 2, T, 4]
        step = h[:, :, 1:] - h[:, :, :-1]  # T - 1 rows: a size the graph computes
        pos = torch.arange(t - 1, dtype=x.dtype)[None, None, :, None]
        c = mask.shape[1]
        weight = torch.where(mask[:, :t - 1] if c >= t else mask.new_ones(b, t - 1), 1.0, 0.5)
        return (step * pos).sum(-1) * weight[:, None, :], torch.zeros(b, c + t).sum(-1)


def _export():
    T, C = Dim("T", min=3, max=16), Dim("C", min=16, max=40)  # T from 3: torch.export specialises T - 1 = 1
    torch.manual_seed(3)
    model = SizeDependent().eval()
    args = (torch.randn(2, 5, 8), torch.rand(2, 20) > 0.5)
    return model, export_program(model, args, dynamic_shapes=({1: T}, {1: C}))


@pytest.fixture(scope="module")
def exported():
    return _export()


@pytest.mark.parametrize("t,c", [(3, 16), (7, 23), (16, 40)])
def test_each_size_lowers_to_the_graph_of_its_own_export_and_computes_the_model(exported, t, c):
    model, ep = exported
    assert is_symbolic(ep)
    rng = np.random.default_rng(t * 100 + c)
    x = torch.tensor(rng.standard_normal((2, t, 8)), dtype=torch.float32)
    mask = torch.tensor(rng.random((2, c)) > 0.5)
    got = lower_program(ep, shapes=[x.shape, mask.shape])
    own = lower_program(export_program(model, (x, mask)))
    assert got.structural_hash() == own.structural_hash()
    with torch.no_grad():
        want = model(x, mask)
    outs = evaluate(got, [x.numpy(), mask.numpy()])
    for o, w in zip(outs, want):
        np.testing.assert_allclose(np.asarray(o), w.numpy(), rtol=1e-5, atol=1e-5)


def test_a_symbolic_program_needs_shapes_and_they_must_fit_it(exported):
    _, ep = exported
    with pytest.raises(InputError, match="symbolic sizes"):
        lower_program(ep)
    for t in (2, 17):
        with pytest.raises(InputError, match=r"outside the range \[3, 16\]"):
            lower_program(ep, shapes=[(2, t, 8), (2, 20)])
    with pytest.raises(InputError, match=r"outside the range \[16, 40\]"):
        SizeBinding(ep, [(2, 4, 8), (2, 8)])
    with pytest.raises(InputError, match="takes"):  # a fixed dim that differs: the batch was exported as 2
        SizeBinding(ep, [(3, 4, 8), (3, 20)])
    with pytest.raises(InputError, match="2 dims"):
        SizeBinding(ep, [(2, 4), (2, 20)])
    with pytest.raises(InputError, match="input shape"):
        SizeBinding(ep, [(2, 4, 8)])


def test_a_concrete_program_lowers_without_shapes():
    model = SizeDependent().eval()
    ep = export_program(model, (torch.randn(2, 5, 8), torch.rand(2, 20) > 0.5))
    assert not is_symbolic(ep)
    lower_program(ep)  # no binding needed
