"""Generated CPU products against a stored weight (egraft/runtime/llvm_kernels.py), checked against float64 numpy
on fresh random values: the kernel alone, inside XLA through its FFI, in a JAX program (knob ``stream``), and in a
saved program loaded by a fresh process."""

from __future__ import annotations

import json
import os
import sys

import ml_dtypes
import numpy as np
import pytest

from egraft.errors import ArtifactError, BackendError
from egraft.runtime import llvm_kernels as lk
from egraft.runtime.derived import RECIPES
from egraft.runtime.llvm_spec import DOTS_ROWS
from egraft.testing import fresh_seed

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "backends"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "generation"))
from compiled_helpers import run_python  # noqa: E402
from runtime_helpers import kernel_on_cores  # noqa: E402
from jax_helpers import check_graph  # noqa: E402

NUMPY = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16),
         "int8": np.dtype(np.int8)}
FLOATS = [d for d in lk.WIDEN if d not in ("int8", "int4")]  # the dtypes a model's own weights come in
UNPACKED = [d for d in lk.WIDEN if d != "int4"]  # one value an element (int4: its own tests, below)


def _weight(rng, shape, dtype):
    """Random weight values of `dtype` (int8: a quantised weight's values, all of -127..127)."""
    if dtype == "int8":
        return rng.integers(-127, 128, shape).astype(np.int8)
    return rng.standard_normal(shape).astype(NUMPY[dtype])


def _case(dtype, rows, k, n, width, seed):
    rng = np.random.default_rng(seed)
    w = _weight(rng, (n, k), dtype)  # nn.Linear's [N, K]
    x = rng.standard_normal((rows, k)).astype(np.float32)
    panels = RECIPES["panels"]({"width": width, "transposed": True}, w)
    spec = lk.KernelSpec(dtype, rows, k, panels.shape[0], width)
    return x, w, panels, spec


def _check(got, x, w, what):
    """float32 sums of K products against float64: within K float32 roundings of the sum of magnitudes."""
    xa, wa = x.astype(np.float64), w.astype(np.float64)
    want = xa @ wa.T
    bound = x.shape[1] * 2.0 ** -23 * (np.abs(xa) @ np.abs(wa).T) + 1e-30
    bad = np.abs(got.astype(np.float64) - want) > bound
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} values off, e.g. {got[bad][:3]} vs {want[bad][:3]}"


@pytest.mark.parametrize("dtype", UNPACKED)
@pytest.mark.parametrize("rows,k,n,width", [(1, 37, 64, 16), (3, 64, 96, 32), (4, 128, 256, 64),
                                            (5, 200, 384, 128), (9, 96, 130, 64)])
def test_the_product_equals_float64_numpy(dtype, rows, k, n, width):
    seed = fresh_seed()
    x, w, panels, spec = _case(dtype, rows, k, n, width, seed)
    out = np.full((rows, spec.panels * width), np.nan, np.float32)  # every column written, padded ones as zeros
    lk.compiled(spec)(x.ctypes.data, panels.ctypes.data, out.ctypes.data)
    _check(out[:, :n], x, w, f"{spec} seed={seed}")
    assert np.all(out[:, n:] == 0)


@pytest.mark.parametrize("dtype", UNPACKED)
def test_xla_calls_the_product_through_its_ffi(dtype):
    import jax

    seed = fresh_seed()
    x, w, panels, spec = _case(dtype, 6, 80, 192, 32, seed)
    f = jax.jit(lambda a, p: lk.call(spec, a, p) * 2.0)  # the custom call inside a program with other ops
    got = np.asarray(f(x, panels)) / 2.0
    _check(got, x, w, f"{spec} through XLA seed={seed}")
    assert lk.ensure(spec) == spec.name  # registered once; asking again is harmless


def test_products_side_by_side_share_helpers_without_waiting_on_each_other():
    """Independent products in one program (XLA may run them at once) each share their panels with the helper
    threads, or compute alone while another holds the pool's slot; none waits for a helper that has not started,
    so repeated calls finish and stay exact."""
    import jax

    seed = fresh_seed()
    cases = [_case("bfloat16", 2, 64, 512, 16, seed + i) for i in range(6)]
    f = jax.jit(lambda *ops: [lk.call(spec, x, p) for (x, _, _, spec), p in zip(cases, ops)])
    panels = [c[2] for c in cases]
    for _ in range(20):
        outs = f(*panels)
    for (x, w, _, spec), got in zip(cases, outs):
        _check(np.asarray(got), x, w, f"{spec} side by side seed={seed}")


@pytest.mark.host_specific  # (two cores only where the process has them)
@pytest.mark.parametrize("cores", [1, 2])
def test_one_core_or_two_the_same_values(cores, tmp_path):
    """Pinned to one core XLA's pool has one thread, no helper starts and the product runs on the caller alone; on
    two one helper starts and joins the products' panels (``runtime.llvm_pool``): the values are the same either
    way (each panel's sums are computed by one thread, in one order)."""
    if cores > len(os.sched_getaffinity(0)):
        pytest.skip(f"this process has fewer than {cores} cores")
    seed = fresh_seed()
    x, w, panels, spec = _case("bfloat16", 3, 96, 1024, 16, seed)
    got, stats = kernel_on_cores(spec, [x, panels], cores, tmp_path, calls=100000)
    one = np.empty_like(got)
    lk.compiled(spec)(x.ctypes.data, panels.ctypes.data, one.ctypes.data)
    np.testing.assert_array_equal(got, one)
    if cores == 1:
        assert stats == {"helpers": 0, "joined": 0}, stats
    else:
        assert stats["helpers"] == 1 and stats["joined"] > 0, stats


def test_products_called_from_two_threads_at_once_stay_exact():
    """Two Python threads calling products at once contend for the pool's one job slot: the one that does not get
    it computes its product alone; every result stays exact and no call waits on the other."""
    import concurrent.futures

    import jax

    seed = fresh_seed()
    cases = [_case("float32", 2, 64, 768, 16, seed + i) for i in range(2)]
    fs = [jax.jit(lambda a, p, spec=spec: lk.call(spec, a, p)) for (_, _, _, spec) in cases]

    def run(i):
        x, w, panels, spec = cases[i]
        for _ in range(200):
            got = np.asarray(fs[i](x, panels))
        return got

    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        outs = list(ex.map(run, range(2)))
    for (x, w, _, spec), got in zip(cases, outs):
        _check(got, x, w, f"{spec} from two threads seed={seed}")


def test_bad_specs_are_refused_with_what_to_do():
    with pytest.raises(BackendError, match="dtype 'int16'.*float32, bfloat16, float16, int8"):
        lk.KernelSpec("int16", 1, 8, 2, 16)
    with pytest.raises(BackendError, match="width in"):
        lk.KernelSpec("float32", 1, 8, 2, 24)
    spec = lk.KernelSpec("bfloat16", 2, 8, 3, 16)
    assert lk.KernelSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def _linear_graph(dtype: str, rows: int, k: int, n: int, seed: int, bias: bool = True):
    """The traced graph of a one-layer model in `dtype` (the product in float32 over widened weights)."""
    import torch

    from egraft.frontend.tracer import trace

    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias), torch.nn.SiLU(), torch.nn.Linear(n, k, bias=False))
    m = m.to(getattr(torch, dtype))
    return trace(m, (torch.randn(rows, k, dtype=getattr(torch, dtype)),))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("rows", [1, 4, 20])
def test_a_program_under_stream_reads_the_stored_weights_and_equals_the_reference(dtype, rows):
    seed = fresh_seed()
    g = _linear_graph(dtype, rows, 64, 160, seed)
    ex = check_graph(g, seed, knobs={"stream": "llvm", "stream_width": 32}, what=f"stream {dtype} rows={rows}")
    assert ex.stats["kernel_dots"] == 2 and ex.stats["panel_dots"] == 0
    assert not ex.folded, "a float32 copy of a widened weight was made"
    assert all(a.dtype == NUMPY[dtype] for a in ex._host), [a.dtype for a in ex._host]
    assert {s.dtype for s in ex.program.kernels} == {dtype}
    xla = check_graph(g, seed, knobs={"stream": "xla", "panels": 16}, what=f"xla {dtype} rows={rows}")
    assert xla.stats["kernel_dots"] == 0


def test_only_a_plain_widening_of_a_stored_weight_is_read_in_place():
    """fold.widened takes Cast(W) and Cast(transpose(W)) of a 2-D weight; a widened slice of a weight (another
    function of W) is not one: it stays a folded float32 value, and the product still equals the reference."""
    from egraft.backends.fold import plan, widened
    from egraft.ir import GraphBuilder, Op

    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (3, 64), "float32")
    w = b.weight("w", rng.standard_normal((256, 64)).astype(ml_dtypes.bfloat16))
    half = w.view_as_strided((128, 64), (64, 1), 64 * 128)  # the second half of W's rows
    outs = [b.add(Op.MatMul, (x, w.T.cast("float32"))), b.add(Op.MatMul, (x, half.T.cast("float32")))]
    g = b.build(outs)
    wide = widened(plan(g))
    assert sorted((v.source, v.transposed) for v in wide.values()) == [("w", True)], wide
    ex = check_graph(g, seed, knobs={"stream": "llvm", "stream_width": 32}, what="slice not widened")
    assert ex.stats["kernel_dots"] == 2 and len(ex.folded) == 1  # the slice's float32 copy, read as panels


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_without_growing_folds_a_widened_weight_no_product_reads_is_computed_where_read(dtype):
    """A product written as a broadcast multiply and a sum (an extraction the e-graph offers) over a widened
    weight: the generated product does not take it, so under ``fold_growing=False`` (``weight_copies=False``) the
    per-call program widens the stored weight where it reads it, and holds no float32 copy; with growing folds
    that copy is folded once (the control).  A plain product beside it still reads its weight in place, and
    both programs equal the reference."""
    from egraft.backends.fold import FOLDED_PREFIX
    from egraft.ir import GraphBuilder, Op
    from egraft.runtime.derived import provenance

    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, 64), "float32")
    values = rng.integers(-127, 128, (96, 64)) if dtype == "int8" else rng.standard_normal((96, 64))
    q = b.weight("q", values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.int8))
    w = b.weight("w", rng.standard_normal((96, 64)).astype(np.float32))
    h = b.add(Op.MatMul, (x, q.T.cast("float32")))  # [1, 96]: read in place
    written = (h.reshape((1, 96, 1)) * q.cast("float32").T.reshape((1, 96, 64))).sum(axis=1)  # [1, 64]
    g = b.build([b.add(Op.MatMul, (written, w.T))])
    for grow in (False, True):
        knobs = {"stream": "llvm", "stream_width": 16, "stream_layout": "rows", "fold_growing": grow}
        ex = check_graph(g, seed, knobs=knobs, what=f"{dtype} fold_growing={grow}")
        assert [s.dtype for s in ex.program.kernels] == [dtype, "float32"]
        copies = [a for a in ex._host if provenance(a) is not None and a.dtype == np.float32 and a.size == 96 * 64]
        folded = [n for n in ex.program.weight_names if n.startswith(FOLDED_PREFIX)]
        if grow:
            assert len(copies) == 1 and len(folded) == 1, (copies, folded)
        else:
            assert not copies and not folded and "q" in ex.program.weight_names, ex.program.weight_names


def test_inline_names_only_folded_values():
    from egraft.backends.fold import inline, plan
    from egraft.errors import InputError
    from egraft.ir import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", (2, 8), "float32")
    g = b.build([x @ b.weight("w", np.ones((8, 8), np.int8)).cast("float32")])
    with pytest.raises(InputError, match="'w' is not a folded value"):
        inline(plan(g), plan(g).main, ["w"])


def test_without_llvmlite_the_knob_offers_only_xla(monkeypatch):
    from egraft.backends.jax import knobs

    g = _linear_graph("float32", 2, 16, 64, fresh_seed())
    assert knobs(g)["stream"][0] == "llvm"
    monkeypatch.setenv("EGRAFT_LLVM_KERNELS", "0")
    assert knobs(g)["stream"] == ["xla"]


def test_a_saved_program_registers_its_kernels_when_loaded(tmp_path):
    """The artifact lists the products it calls; a fresh process loads it and computes the same outputs. A
    manifest naming a kernel egraft does not make is refused with what to do."""
    import torch

    import egraft
    from egraft.backends import lower
    from egraft.runtime.manifest import MANIFEST_FILE, write_manifest

    seed = fresh_seed()
    g = _linear_graph("bfloat16", 3, 32, 128, seed)
    ex = lower(g, "jax", "cpu", {"stream": "llvm", "stream_width": 32})
    d = str(ex.export(str(tmp_path / "art")))
    manifest = json.load(open(os.path.join(d, MANIFEST_FILE)))
    listed = manifest["kernels"][0]["cpu_kernels"]
    assert [lk.KernelSpec.from_json(s) for s in listed] == ex.program.kernels
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    want = ex(x)[0].float().numpy()
    np.save(tmp_path / "x.npy", x.float().numpy())
    code = (f"import numpy as np, torch, egraft; art = egraft.load({d!r}); "
            f"x = torch.from_numpy(np.load({str(tmp_path / 'x.npy')!r})).to(torch.bfloat16); "
            f"np.save({str(tmp_path / 'y.npy')!r}, art(x)[0].float().numpy()); print('{{}}')")
    run_python(code)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)
    # what was saved is what the executable compiled (so a load here finds it in XLA's cache), for the CPU only
    assert open(os.path.join(d, "program.stablehlo"), "rb").read() == ex.exported[0]
    assert manifest["target"]["platforms"] == ["cpu"] and manifest["kernels"][0]["platforms"] == ["cpu"]
    with pytest.raises(BackendError, match="generated CPU products.*not on \\['cuda'\\].*platforms=\\['cpu'\\]"):
        ex.export(str(tmp_path / "gpu"), platforms=["cpu", "cuda"])
    assert not (tmp_path / "gpu").exists()

    manifest["kernels"][0]["cpu_kernels"][0]["dtype"] = "int3"
    for k in ("format", "format_version", "egraft_version", "files"):
        manifest.pop(k)
    write_manifest(d, manifest)
    with pytest.raises(ArtifactError, match="cpu_kernels entry.*not a kernel this egraft makes.*egraft compile"):
        egraft.load(d)


_ENGINES = []  # llvmlite crashes disposing one of several engines of the same module: kept for the process, as
# llvm_kernels keeps its own


def test_object_code_is_kept_for_the_next_process_and_a_damaged_copy_is_rebuilt(tmp_path, monkeypatch):
    """The compiled kernel's object code goes to <cache dir>/llvm; a later compile reads it back instead of running
    LLVM (and computes the same values); a file whose checksum does not match is compiled again."""
    import llvmlite.binding as llvm

    monkeypatch.setenv("EGRAFT_CACHE_DIR", str(tmp_path))
    x, w, panels, spec = _case("bfloat16", 2, 48, 48, 16, fresh_seed())
    passes = []
    real = llvm.create_pass_builder
    monkeypatch.setattr(llvm, "create_pass_builder", lambda *a, **k: passes.append(1) or real(*a, **k))

    def run():
        engine, _mod = lk._compile(spec)
        got = np.empty((2, 48), np.float32)
        fn = lk.ctypes.CFUNCTYPE(None, lk.ctypes.c_void_p, lk.ctypes.c_void_p, lk.ctypes.c_void_p)(
            engine.get_function_address("product"))
        fn(x.ctypes.data, panels.ctypes.data, got.ctypes.data)
        _check(got, x, w, "kept kernel")
        return engine

    _ENGINES.append(run())
    kept = list((tmp_path / "llvm").glob("*.o"))
    assert len(kept) == 1 and passes == [1]
    _ENGINES.append(run())
    assert passes == [1], "the kept object code was not read back"
    data = bytearray(kept[0].read_bytes())
    data[-1] ^= 0xFF
    kept[0].write_bytes(bytes(data))
    _ENGINES.append(run())
    assert passes == [1, 1], "a damaged object file was used"
    monkeypatch.setenv("EGRAFT_XLA_CACHE", "0")  # the cache switch turns this cache off too
    assert lk._object_path("ir") is None


# --- layout "rows": a [N, K] weight read where it is stored -----------------------------------------------------

ROWS_CASES = [(1, 32, 64, 16), (3, 64, 96, 32), (4, 128, 256, 64), (5, 16, 256, 128), (9, 96, 128, 64),
              (1, 48, 80, 32), (6, 32, 208, 64), (5, 2048, 80, 32), (3, 1024, 64, 64), (8, 2048, 32, 16)]


@pytest.mark.parametrize("dtype", UNPACKED)
@pytest.mark.parametrize("rows,k,n,width,form", [(*c, "") for c in ROWS_CASES]
                         + [(*c, "dots") for c in ROWS_CASES if 1 < c[0] <= DOTS_ROWS])
def test_the_rows_product_reads_the_stored_weight_and_equals_float64_numpy(dtype, rows, k, n, width, form):
    """One row (the dot kernel) and several (the transposed tiles; blocks of dots where a tile's rows would
    share an L1 set: k * itemsize a multiple of 4 KB, or where asked for: form "dots", 2 to DOTS_ROWS rows),
    full last panels and a part-filled one."""
    seed = fresh_seed()
    x, w, _, _ = _case(dtype, rows, k, n, width, seed)
    panels = -(-n // width)
    spec = lk.KernelSpec(dtype, rows, k, panels, width, "rows", n % width and n, form=form)
    out = np.full((rows, panels * width), np.nan, np.float32)
    lk.compiled(spec)(x.ctypes.data, w.ctypes.data, out.ctypes.data)
    _check(out[:, :n], x, w, f"{spec} seed={seed}")
    got = np.asarray(__import__("jax").jit(lambda a, b: lk.call(spec, a, b))(x, w))  # through XLA's FFI
    _check(got[:, :n], x, w, f"{spec} through XLA seed={seed}")


def test_several_rows_read_tiles_unless_their_rows_share_an_l1_set():
    from egraft.runtime.llvm_tiles import tiles_alias

    def form(dtype, k):
        return "dots" if tiles_alias(lk.KernelSpec(dtype, 4, k, 1, 16, "rows")) else "tiles"

    assert [form("float32", k) for k in (896, 1024, 2048, 4864)] == ["tiles", "dots", "dots", "tiles"]
    assert [form("bfloat16", k) for k in (896, 1024, 2048, 8192)] == ["tiles", "tiles", "dots", "dots"]
    assert [form("int8", k) for k in (896, 2048, 4096, 8192)] == ["tiles", "tiles", "dots", "dots"]
    for k, want in ((512, "@tblock4"), (2048, "@dblock4")):  # the module holds the form's block
        assert want in lk.module_ir(lk.KernelSpec("bfloat16", 4, k, 1, 16, "rows"))


def test_a_spec_asks_for_the_dots_form_at_a_few_rows_of_float32_x_only_and_keeps_it_in_json():
    from egraft.runtime.llvm_tiles import DOTS_AHEAD

    spec = lk.KernelSpec("int8", 4, 512, 2, 16, "rows", form="dots")
    assert lk.KernelSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert spec.name != lk.KernelSpec("int8", 4, 512, 2, 16, "rows").name
    assert "@dblock4" in lk.module_ir(spec) and "@tblock4" in lk.module_ir(lk.KernelSpec("int8", 4, 512, 2, 16, "rows"))
    for bad in (dict(rows=1), dict(rows=9), dict(layout="panels"), dict(form="tiles")):
        args = {"rows": 4, "layout": "rows", "form": "dots", **bad}
        with pytest.raises(BackendError, match="form"):
            lk.KernelSpec("float32", args["rows"], 512, 2, 16, args["layout"], form=args["form"])
    for dtype in ("float32", "int8", "bfloat16", "int4"):  # each weight row of a dot block asked for ahead where
        ir = lk.module_ir(lk.KernelSpec(dtype, 4, 512, 2, 16, "rows", group=64 if dtype == "int4" else 0,  # measured
                                        form="" if dtype == "int4" else "dots"))  # (int4: always dots)
        assert ("@llvm.prefetch.p0(ptr %pfp3" in ir) == (dtype in DOTS_AHEAD) and "@dblock4" in ir, dtype


def test_a_one_row_integer_product_asks_for_its_weight_ahead_and_a_float_one_does_not():
    """int8 / int4 weights: each step prefetches the weight row runtime.llvm_rows.AHEAD bytes past its reads
    (the values: the tests above and below, whose small weights end well before that); float weights (rows
    longer than the short form's, runtime.llvm_short): none."""
    from egraft.runtime.llvm_rows import AHEAD

    for dtype, group in (("int8", 0), ("int4", 64)):
        ir = lk.module_ir(lk.KernelSpec(dtype, 1, 128, 1, 16, "rows", group=group))
        assert f"%pfo0 = add i64 %kb, {AHEAD[dtype]}" in ir and "@llvm.prefetch.p0(ptr %pfp0" in ir
    for dtype in FLOATS:
        assert "call void @llvm.prefetch" not in lk.module_ir(lk.KernelSpec(dtype, 1, 512, 1, 16, "rows"))


def test_a_rows_spec_needs_multiples_of_16_and_keeps_its_layout_in_json():
    with pytest.raises(BackendError, match="multiples of 16 and 16"):
        lk.KernelSpec("float32", 1, 40, 2, 16, "rows")
    with pytest.raises(BackendError, match="multiples of 16 and 16"):
        lk.KernelSpec("float32", 1, 32, 3, 32, "rows", 72)  # 72 weight rows: no multiple of 16
    with pytest.raises(BackendError, match="within its last panel"):
        lk.KernelSpec("float32", 1, 32, 3, 32, "rows", 48)  # 48 rows fill 2 panels of 32, not 3
    with pytest.raises(BackendError, match="unknown layout 'cols'"):
        lk.KernelSpec("float32", 1, 32, 2, 16, "cols")
    spec = lk.KernelSpec("bfloat16", 2, 32, 3, 32, "rows", 80)
    assert lk.KernelSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec and spec.weight_rows == 80
    assert spec.name != lk.KernelSpec("bfloat16", 2, 32, 3, 32).name
    old = {k: v for k, v in lk.KernelSpec("bfloat16", 2, 32, 3, 16).to_json().items() if k not in ("layout", "n")}
    assert lk.KernelSpec.from_json(old).layout == "panels"  # a manifest written before layouts existed


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("few_rows", ["dots", "tiles"])
def test_a_program_of_a_few_rows_reads_its_weights_in_the_form_the_knob_names(dtype, few_rows):
    """Knob few_rows: the products of 4 rows of float32 x (a batch's decode step) take blocks of dots or tiles;
    16 rows (a prompt's chunk) keep the tiles; every program equals the reference."""
    import torch

    from egraft.frontend.quantize import quantize
    from egraft.frontend.tracer import trace

    seed = fresh_seed()
    for rows, want in ((4, "dots" if few_rows == "dots" else ""), (16, "")):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(64, 112), torch.nn.SiLU(), torch.nn.Linear(112, 64, bias=False))
        m = quantize(m.eval(), "int8")[0] if dtype == "int8" else m
        g = trace(m, (torch.randn(rows, 64),))
        knobs = {"stream": "llvm", "stream_width": 16, "stream_layout": "rows", "few_rows": few_rows,
                 "fold_growing": False}
        ex = check_graph(g, seed, knobs=knobs, what=f"{dtype} rows={rows} few_rows={few_rows}")
        assert [(s.dtype, s.rows, s.form) for s in ex.program.kernels] == [(dtype, rows, want)] * 2


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("rows", [1, 6])
@pytest.mark.parametrize("n,layout", [(112, "rows"), (104, "panels")])
def test_a_program_under_stream_layout_rows_binds_the_weights_themselves(dtype, rows, n, layout):
    """[N, K] weights whose N and K 16 divides are passed as they are (the same arrays, no panel copy; N = 112
    leaves the last panel of 32 half full); others keep their panel copy; the program equals the reference."""
    from egraft.runtime.derived import provenance

    seed = fresh_seed()
    g = _linear_graph(dtype, rows, 64, n, seed)  # Linear(64, n), then Linear(n, 64)
    knobs = {"stream": "llvm", "stream_width": 32, "stream_layout": "rows"}
    ex = check_graph(g, seed, knobs=knobs, what=f"rows {dtype} rows={rows} n={n}")
    assert ex.stats["kernel_dots"] == 2 and ex.stats["panel_dots"] == 0
    assert [s.layout for s in ex.program.kernels] == [layout, layout]
    copies = [a for a in ex._host if provenance(a) is not None]
    stored = list(g.weights.values())
    if layout == "rows":
        assert not copies, "a weight the rows layout reads was copied"
        assert all(any(a is w or np.shares_memory(a, w) for w in stored) for a in ex._host if a.ndim == 2)
    else:
        assert len(copies) == 2


# --- packed int4 with a scale per group of k (egraft.frontend.quantize's layout) ----------------------------------

def _int4_case(rows, k, n, group, seed):
    """x, the packed bytes [n, k / 2] (every byte value), the scales [n, k / group] and the dequantised weight."""
    import torch

    from egraft.frontend.quantize import unpack_int4

    rng = np.random.default_rng(seed)
    packed = rng.integers(-128, 128, (n, k // 2)).astype(np.int8)
    scales = (rng.uniform(0.5, 2.0, (n, k // group)) * rng.choice([1e-3, 1.0, 30.0], (n, 1))).astype(np.float32)
    values = unpack_int4(torch.from_numpy(packed)).numpy().astype(np.float32)
    w = (values.reshape(n, -1, group) * scales[:, :, None]).reshape(n, k)
    return rng.standard_normal((rows, k)).astype(np.float32), packed, scales, w


@pytest.mark.parametrize("rows,k,n,width,group", [(1, 32, 64, 16, 32), (1, 256, 96, 32, 64), (1, 128, 80, 32, 128),
                                                  (3, 64, 96, 32, 32), (4, 256, 128, 64, 128), (9, 128, 48, 16, 64)])
def test_the_int4_product_dequantises_in_registers_and_equals_float64_numpy(rows, k, n, width, group):
    """One row (a dot per weight row, a block of 32 values a step) and several (blocks of dots), a part-filled last
    panel, alone and through XLA's FFI with the scales as a third operand."""
    import jax

    seed = fresh_seed()
    x, packed, scales, w = _int4_case(rows, k, n, group, seed)
    panels = -(-n // width)
    spec = lk.KernelSpec("int4", rows, k, panels, width, "rows", n % width and n, group)
    out = np.full((rows, panels * width), np.nan, np.float32)
    lk.compiled(spec)(x.ctypes.data, packed.ctypes.data, out.ctypes.data, scales.ctypes.data)
    _check(out[:, :n], x, w, f"{spec} seed={seed}")
    got = np.asarray(jax.jit(lambda a, b, c: lk.call(spec, a, b, c) * 2.0)(x, packed, scales)) / 2.0
    _check(got[:, :n], x, w, f"{spec} through XLA seed={seed}")


@pytest.mark.host_specific  # (the lookup only where the CPU has AVX-512F, the spread where it has AVX2)
@pytest.mark.parametrize("made", ["call", "panel"])
@pytest.mark.parametrize("form", ["convert", "spread", "lookup"])
def test_the_one_row_int4_product_reads_fields_in_each_form_and_each_equals_numpy(form, made, monkeypatch):
    """A field's value is looked up where the host has AVX-512F (vpermps, runtime.llvm_int4.U_TABLE), looked up
    and spread into lanes where it has AVX2 (vpshufb, groups of 64 or more, x read in the order the fields are),
    elsewhere converted by xor, mask and convert: each form, forced, against float64 numpy (each only on a host
    that has its instructions), with what it makes of x (the groups' sums, the spread's copy) made once a call
    (``@prepare``) or, where x would not fit the stack, once a panel."""
    from egraft.runtime import llvm_int4

    if form == "lookup" and not llvm_int4.permutes():
        pytest.skip("this CPU has no AVX-512F (vpermps)")
    if form == "spread" and not llvm_int4.shuffles():
        pytest.skip("this CPU has no AVX2 (vpshufb on 32 bytes)")
    monkeypatch.setattr(llvm_int4, "int4_form", lambda group: "convert" if form == "spread" and group < 64 else form)
    if made == "panel":
        monkeypatch.setattr(llvm_int4, "PREPARED_MAX", 0)
    assert sorted(llvm_int4.spread_order()) == list(range(64))
    marks = {"lookup": "permvar", "spread": "pshuf.b", "convert": "sitofp"}
    for k, n, group in ((576, 96, 64), (128, 48, 32), (1536, 64, 128)):
        # shapes of this form and this way only: a process keeps each spec's kernel as first made
        n += 16 * ["convert", "spread", "lookup"].index(form) + 64 * (made == "panel")
        seed = fresh_seed()
        x, packed, scales, w = _int4_case(1, k, n, group, seed)
        spec = lk.KernelSpec("int4", 1, k, -(-n // 32), 32, "rows", n % 32 and n, group)
        used = "convert" if form == "spread" and group < 64 else form
        ir = lk.module_ir(spec)
        assert all((marks[f] in ir) == (f == used) for f in marks), used
        assert ("call void @prepare(" in ir) == (made == "call") == (llvm_int4.prepared(spec) == k + k // group)
        out = np.full((1, spec.panels * 32), np.nan, np.float32)
        lk.compiled(spec)(x.ctypes.data, packed.ctypes.data, out.ctypes.data, scales.ctypes.data)
        _check(out[:, :n], x, w, f"{spec} form={used} made once a {made} seed={seed}")
        if made == "call":  # through XLA's FFI as well (the handler makes it, on its own stack)
            import jax

            got = np.asarray(jax.jit(lambda a, b, c: lk.call(spec, a, b, c) * 2.0)(x, packed, scales)) / 2.0
            _check(got[:, :n], x, w, f"{spec} form={used} through XLA seed={seed}")


@pytest.mark.parametrize("rows,group", [(2, 32), (1, 64)])  # (one row, groups of 64: the host's one-row form,
@pytest.mark.parametrize("cores", [1, 2])                   # the spread on an AVX2 host: x copied once a call)
def test_an_int4_product_shared_with_helper_threads_gives_the_same_values(cores, rows, group, tmp_path):
    """The scales travel in the job the pool's helpers read (two cores) as in the direct call (one)."""
    seed = fresh_seed()
    x, packed, scales, w = _int4_case(rows, 128, 1024, group, seed)
    spec = lk.KernelSpec("int4", rows, 128, 16, 64, "rows", 0, group)
    got, _ = kernel_on_cores(spec, [x, packed, scales], cores, tmp_path)
    _check(got, x, w, f"{spec} on {cores} cores seed={seed}")
    one = np.empty_like(got)
    lk.compiled(spec)(x.ctypes.data, packed.ctypes.data, one.ctypes.data, scales.ctypes.data)
    np.testing.assert_array_equal(got, one)


def test_an_int4_spec_needs_a_group_that_divides_k_and_the_rows_layout():
    with pytest.raises(BackendError, match="int4 weights reads them as stored rows"):
        lk.KernelSpec("int4", 1, 64, 2, 16, "rows")  # no group
    with pytest.raises(BackendError, match="int4 weights reads them as stored rows"):
        lk.KernelSpec("int4", 1, 96, 2, 16, "rows", 0, 64)  # 64 does not divide 96
    with pytest.raises(BackendError, match="int4 weights reads them as stored rows"):
        lk.KernelSpec("int4", 1, 64, 2, 16, "panels", 0, 32)
    with pytest.raises(BackendError, match="only int4 has groups"):
        lk.KernelSpec("int8", 1, 64, 2, 16, "rows", 0, 32)
    spec = lk.KernelSpec("int4", 2, 64, 2, 16, "rows", 0, 32)
    assert lk.KernelSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec and "_g32" in spec.name


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("layout", ["rows", "panels"])
def test_a_program_reads_int4_layers_packed_and_equals_the_reference(rows, layout):
    """A traced int4 layer's dequantised weight (``Cast(unpack_int4(P)) * S``) is recognised by the fold: under
    layout "rows" the generated product reads the packed bytes and the scales, nothing dequantised is made; under
    "panels" (no int4 panel form) XLA's product reads the dequantised value, which ``fold_growing=False`` has the
    program compute where it reads it (no copy held).  Both equal the reference."""
    import torch

    from egraft.frontend.quantize import quantize
    from egraft.frontend.tracer import trace
    from egraft.runtime.derived import provenance

    seed = fresh_seed()
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 160), torch.nn.SiLU(), torch.nn.Linear(160, 64, bias=False)).eval()
    qm, _ = quantize(m, "int4", 32)
    g = trace(qm, (torch.randn(rows, 64),))
    knobs = {"stream": "llvm", "stream_width": 32, "stream_layout": layout, "fold_growing": False}
    ex = check_graph(g, seed, knobs=knobs, what=f"int4 {layout} rows={rows}")
    if layout == "rows":
        assert [(s.dtype, s.group) for s in ex.program.kernels] == [("int4", 32)] * 2 and not ex.folded
        assert sorted(str(a.dtype) for a in ex._host if a.ndim == 2) == ["float32", "float32", "int8", "int8"]
        assert not [a for a in ex._host if provenance(a) is not None]
    else:
        assert not ex.program.kernels and not ex.folded
        assert sorted(str(a.dtype) for a in ex._host if a.ndim == 2) == ["float32", "float32", "int8", "int8"]
