"""The JAX backend's panel form of few-row products against a weight (egraft/backends/jax/panels.py)."""

from __future__ import annotations

import numpy as np
import pytest
from jax_helpers import check_graph

from egraft.backends.jax import panels
from egraft.ir import GraphBuilder, Op
from egraft.testing import fresh_seed


def _linear_graph(rows: int, k: int, n: int, seed: int, transposed=True, extra_use=False):
    """x [rows, k] @ W as a MatMul idiom node, W stored [n, k] (nn.Linear) or [k, n]."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (rows, k), "float32")
    if transposed:
        w = b.weight("w", rng.standard_normal((n, k)).astype(np.float32))
        rhs = w.T
    else:
        w = b.weight("w", rng.standard_normal((k, n)).astype(np.float32))
        rhs = w
    outs = [b.add(Op.MatMul, (x, rhs))]
    if extra_use:  # a product with too many rows for panels reads the plain weight
        outs.append(b.add(Op.MatMul, (b.input("x2", (panels.MAX_ROWS + 1, k), "float32"), rhs)))
    return b.build(outs)


@pytest.mark.parametrize("rows", [1, 4, 9, panels.MAX_ROWS])
@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("width", [16, 64])
def test_few_rows_read_the_weight_in_panels(rows, transposed, width):
    seed = fresh_seed()
    g = _linear_graph(rows, 96, 256, seed, transposed)
    ex = check_graph(g, seed, knobs={"panels": width, "stream": "xla"}, what=f"panels {width} rows={rows} transposed={transposed}")
    assert ex.stats["panel_dots"] == 1
    names = ex.program.weight_names
    assert names == (f"w{panels.SEP}{width}{'T' if transposed else ''}",), names  # the plain form is not passed too
    assert ex.weights[0].shape == (256 // width, 96, width)
    off = check_graph(g, seed, knobs={"panels": 0, "stream": "xla"}, what="panels off")
    assert off.stats["panel_dots"] == 0 and off.program.weight_names == ("w",)


def test_where_panels_do_not_apply():
    seed = fresh_seed()
    for g, why in ((_linear_graph(panels.MAX_ROWS + 1, 32, 128, seed), "too many rows"),
                   (_linear_graph(4, 32, 64, seed), "a single panel")):
        ex = check_graph(g, seed, knobs={"panels": 64, "stream": "xla"}, what=why)
        assert ex.stats["panel_dots"] == 0, why


def test_a_weight_read_elsewhere_is_passed_in_both_forms():
    seed = fresh_seed()
    g = _linear_graph(3, 32, 128, seed, extra_use=True)
    ex = check_graph(g, seed, knobs={"panels": 64, "stream": "xla"}, what="both forms")
    assert ex.stats["panel_dots"] == 1
    assert set(ex.program.weight_names) == {"w", f"w{panels.SEP}64T"}


@pytest.mark.parametrize("n,width", [(130, 64), (97 * 2, 64), (50, 16)])
def test_ragged_last_panel_is_padded_and_cropped(n, width):
    seed = fresh_seed()
    ex = check_graph(_linear_graph(5, 48, n, seed), seed, knobs={"panels": width, "stream": "xla"}, what=f"ragged N={n}")
    assert ex.stats["panel_dots"] == 1 and ex.weights[0].shape == (-(-n // width), 48, width)


def test_panel_form_layout():
    w = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)  # [N=6, K=4], nn.Linear's layout
    p = panels.panel_form(w, panels.PanelWeight("w", 2, True))
    assert p.shape == (3, 4, 2) and p.flags.c_contiguous
    for j in range(3):
        np.testing.assert_array_equal(p[j], w.T[:, 2 * j:2 * j + 2])


def test_saved_program_with_panel_weights_reloads(tmp_path):
    """A JAX artifact whose program takes panel weights runs the same after egraft.load."""
    import egraft
    from egraft.backends import lower

    seed = fresh_seed()
    g = _linear_graph(4, 64, 128, seed)
    ex = lower(g, "jax", "cpu", {"panels": 64})
    x = np.random.default_rng(seed).standard_normal((4, 64)).astype(np.float32)
    want = ex(x)[0]
    from egraft.backends.artifact import save_artifact

    out = tmp_path / "art"
    save_artifact(ex, str(out))
    got = egraft.load(str(out))(x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("x_shape", [(4, 96), (2, 3, 96), (1, 96)])
@pytest.mark.parametrize("transposed", [True, False])
def test_primitive_products_read_panels_too(x_shape, transposed):
    """The traced (primitive) form of x @ W, which a reused lowering runs, gets the panel form as well."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", x_shape, "float32")
    if transposed:
        w = b.weight("w", rng.standard_normal((256, 96)).astype(np.float32))
        y = x @ w.T
    else:
        w = b.weight("w", rng.standard_normal((96, 256)).astype(np.float32))
        y = x @ w
    g = b.build([y])
    assert "MatMul" not in g.op_counts()
    ex = check_graph(g, seed, knobs={"panels": 64, "stream": "xla"}, what=f"primitive x{x_shape} transposed={transposed}")
    assert ex.stats["panel_dots"] == 1 and ex.stats["peephole_dots"] == 0
    assert ex.program.weight_names == (f"w{panels.SEP}64{'T' if transposed else ''}",)


def test_batched_primitive_products_keep_the_plain_dot():
    seed = fresh_seed()
    b = GraphBuilder()
    a, c = b.input("a", (2, 4, 96), "float32"), b.input("c", (2, 96, 128), "float32")
    ex = check_graph(b.build([a @ c]), seed, knobs={"panels": 64, "stream": "xla"}, what="batched")
    assert ex.stats["panel_dots"] == 0 and ex.stats["peephole_dots"] == 1


def test_one_panel_form_per_weight_array_shared_by_executables():
    """Two programs binding the same weight array (a generation's step programs) share its panels."""
    from egraft.backends import lower

    seed = fresh_seed()
    g1 = _linear_graph(2, 64, 128, seed)
    g2 = _linear_graph(8, 64, 128, seed).with_weights({"w": g1.weights["w"]})
    e1, e2 = (lower(g, "jax", "cpu", {"panels": 64}) for g in (g1, g2))
    a, b = e1.program.host_weights()[0], e2.program.host_weights()[0]
    assert a is b and not a.flags.writeable and a.ctypes.data % 64 == 0
    w = np.asarray(g1.weights["w"])
    assert panels.panel_form(w.copy(), panels.PanelWeight("w", 64, True)) is not a  # another array: its own
