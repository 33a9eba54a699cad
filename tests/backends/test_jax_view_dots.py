"""Products over a view read in place (egraft/backends/jax/view_dots.py, knob ``view_dots``): attention over a
cache's first slots, checked against the reference interpreter on fresh random inputs; the shapes it must leave
to XLA's dot; a saved program that calls it, loaded by a fresh process; a traced model's decode step."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from egraft.backends import lower
from egraft.ir import GraphBuilder
from egraft.runtime import llvm_kernels as lk
from egraft.testing import fresh_seed

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "generation"))
from compiled_helpers import run_python  # noqa: E402
from jax_helpers import check_graph  # noqa: E402

ON, OFF = {"view_dots": "llvm"}, {"view_dots": "xla"}


def _attention(dtype="float32", rows=2, kv=2, group=1, tokens=1, slots=80, context=64, dim=16, slot_major=False):
    """softmax(q K^T) V over the first `context` slots of a cache input ``[rows, kv, slots, dim]`` (`slot_major`:
    ``[rows, slots, kv, dim]``), each key-value head repeated for `group` query heads as transformers'
    ``repeat_kv`` does (expand, then a reshape that merges the repeat: a view of a view)."""
    b = GraphBuilder()
    heads = kv * group
    q = b.input("q", (rows, heads, tokens, dim), dtype)
    shape = (rows, slots, kv, dim) if slot_major else (rows, kv, slots, dim)
    caches = [b.input(name, shape, dtype) for name in ("k", "v")]
    views = []
    for c in caches:
        if slot_major:
            v = c.view_as_strided((rows, kv, context, dim), (slots * kv * dim, dim, kv * dim, 1))
        else:
            v = c.view_as_strided((rows, kv, context, dim), (kv * slots * dim, slots * dim, dim, 1))
        if group > 1:
            v = v.unsqueeze(2).expand((rows, kv, group, context, dim)).reshape((rows, heads, context, dim))
        views.append(v)
    k, v = views
    p = ((q @ k.transpose(-2, -1)) * (dim ** -0.5)).softmax(-1)
    return b.build([p.cast(dtype) @ v])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("group,tokens", [(1, 1), (3, 1), (2, 4)])
def test_attention_over_a_cache_prefix_reads_it_in_place_and_equals_the_reference(dtype, group, tokens):
    seed = fresh_seed()
    g = _attention(dtype, group=group, tokens=tokens)
    ex = check_graph(g, seed, knobs=ON, what=f"view dots {dtype} group={group}")
    assert ex.stats["view_dots"] == 2, ex.stats  # the scores and the weighted values
    specs = ex.program.kernels
    assert {s.layout for s in specs} == {"rows", "kn"} and {s.dtype for s in specs} == {dtype}
    assert all(s.batch == 2 * 2 and s.rows == group * tokens and s.bstride == 80 * 16 for s in specs), specs
    off = check_graph(g, seed, knobs=OFF, what=f"dots {dtype}")
    assert off.stats["view_dots"] == 0 and not off.program.kernels


def test_batch_axes_that_are_not_one_stride_keep_the_dot():
    """A slot-major cache ([rows, slots, heads, dim]): the keys' rows are not head_dim apart and the batch axes
    (row, head) do not step as one, so both products stay XLA's dot, and the result is still the reference's."""
    seed = fresh_seed()
    ex = check_graph(_attention(slot_major=True, rows=2, kv=2), seed, knobs=ON, what="slot-major cache")
    assert ex.stats["view_dots"] == 0 and ex.stats["peephole_dots"] == 2, ex.stats
    one = check_graph(_attention(slot_major=True, rows=1, kv=2), seed, knobs=ON, what="one row, slot-major")
    assert one.stats["view_dots"] == 1, one.stats  # the values' product: its rows are heads x dim apart ("kn")
    assert [(s.layout, s.ldw, s.batch, s.bstride) for s in one.program.kernels] == [("kn", 32, 2, 16)]


def test_a_weight_or_a_whole_value_is_not_read_through_this_path():
    """A product over a sliced weight is the panels' (panels.py); one over a whole input needs no view."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (3, 32), "float32")
    w = b.weight("w", rng.standard_normal((96, 32)).astype(np.float32))
    y = b.input("y", (4, 32, 48), "float32")
    half = w.view_as_strided((48, 32), (32, 1), 32 * 48)
    outs = [x @ half.transpose(0, 1), x @ y]
    ex = check_graph(b.build(outs), seed, knobs=ON, what="weight and whole value")
    assert ex.stats["view_dots"] == 0, ex.stats


def test_a_saved_program_with_view_products_loads_in_a_fresh_process(tmp_path):
    import egraft  # noqa: F401
    from egraft.runtime.manifest import MANIFEST_FILE

    seed = fresh_seed()
    g = _attention("bfloat16", group=3)
    ex = lower(g, "jax", "cpu", ON)
    d = str(ex.export(str(tmp_path / "art")))
    listed = json.load(open(os.path.join(d, MANIFEST_FILE)))["kernels"][0]["cpu_kernels"]
    assert [lk.KernelSpec.from_json(s) for s in listed] == ex.program.kernels and len(listed) == 2
    rng = np.random.default_rng(seed)
    ins = [rng.standard_normal(g.nodes[i].shape).astype(np.float32) for i in g.input_ids]
    for k, a in enumerate(ins):
        np.save(tmp_path / f"in{k}.npy", a)
    import torch

    want = ex(*[torch.from_numpy(a).to(torch.bfloat16) for a in ins])[0].float().numpy()
    code = (f"import numpy as np, torch, egraft; art = egraft.load({d!r}); "
            f"ins = [torch.from_numpy(np.load({str(tmp_path)!r} + f'/in{{k}}.npy')).to(torch.bfloat16) "
            f"for k in range({len(ins)})]; "
            f"np.save({str(tmp_path / 'y.npy')!r}, art(*ins)[0].float().numpy()); print('{{}}')")
    run_python(code)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_traced_decode_step_reads_its_caches_in_place(family):
    """A tiny model's slot-cache step (decode, and a prompt chunk): every layer's two attention products read the
    updated caches in place, and the step equals the reference."""
    import torch

    from egraft.frontend.causal_lm import StepTracer, step_module
    from egraft.ir import evaluate
    from egraft.measure.inputs import random_inputs
    from egraft.testing import assert_close
    from egraft.frontend.weights import WeightCopies
    from egraft.runtime.step_spec import Bucket
    from gen_helpers import FAMILIES

    seed = fresh_seed()
    torch.manual_seed(seed)
    step = step_module(FAMILIES[family]().eval(), 2, 64, (1, 4))
    tracer = StepTracer(step, WeightCopies(views=True))
    for chunk in (1, 4):
        g = tracer(Bucket(chunk, step.spec.full_context, 2))
        ins = random_inputs(g, seed)  # (positions distinct within a row, as the cache write needs)
        ex = lower(g, "jax", "cpu", {**ON, "stream": "llvm"})
        assert_close(ex(*ins), evaluate(g, ins), [d for _, d in g.output_types()],
                     what=f"{family} chunk {chunk} seed={seed}")
        assert ex.stats["view_dots"] == 2 * 2, ex.stats  # 2 layers
