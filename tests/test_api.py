"""egraft.compile and CompiledModel: outputs equal eager PyTorch, one program per signature, structured
outputs, the report, save -> egraft.load, clear errors, and a second process answered by the cache.

Searches here use the cost model (fitness="model") and a one-second budget, with a cache in a
temporary directory shared by the module, so a model compiled twice is searched once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import egraft
from egraft.api import pipeline
from egraft.api.report import text_report
from egraft.search.cache import Cache
from egraft.errors import ArtifactError, BackendError, InputError, ValidationError
from egraft.models import MODELS
from egraft.measure import rel_err

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return Cache(tmp_path_factory.mktemp("egraft-cache"))


def fast(store, **kw):
    return {"fitness": "model", "budget": 1, "cache": store, "progress": False, **kw}


@pytest.fixture(scope="module")
def mlp(store):
    w = MODELS["mlp"]
    model = w.build("tiny", seed=0)
    x = w.example_inputs(model, seed=0)
    return model, x, egraft.compile(model, example_inputs=x, **fast(store))


class TupleOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 6)

    def forward(self, x):
        h = self.lin(x)
        return h.relu(), None, (h.sum(-1), x * 2)


class DictOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x, mask=None, *, scale: float = 1.0):
        y = self.lin(x) * scale
        if mask is not None:
            y = y + mask
        return {"logits": y, "probs": y.softmax(-1), "top": y.argmax(-1)}


def close(got, want, tol=1e-5):
    assert type(got) is type(want) or isinstance(want, torch.Tensor)
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.is_floating_point():
        assert rel_err(got.double().numpy(), want.double().numpy()) <= tol
    else:
        assert torch.equal(got, want)


def test_outputs_match_eager_on_fresh_inputs(mlp):
    model, x, cm = mlp
    assert isinstance(cm, torch.nn.Module) and cm.model is model
    rng = np.random.default_rng(1)
    for _ in range(3):
        xs = torch.from_numpy(rng.standard_normal(tuple(x[0].shape)).astype(np.float32))
        assert xs.abs().max() > 0
        with torch.no_grad():
            want = model(xs)
        got = cm(xs)
        assert isinstance(got, torch.Tensor) and not got.requires_grad
        close(got, want)
    assert list(cm.executables) == ["4x32:float32"] and list(cm.results) == ["4x32:float32"]


def test_one_signature_calls_take_the_executables_fast_path(store):
    """With one compiled signature a call goes straight to the executable's precomputed path; a second
    signature turns it off (keyed lookup), and the answers are the model's either way."""
    model = DictOut().eval()
    a, b = torch.randn(2, 8), torch.randn(3, 5, 8)
    cm = egraft.compile(model, example_inputs=(a,), backend="jax", **fast(store))
    assert cm._fast is not None
    seen = []
    inner = cm._fast
    cm._fast = lambda xs: seen.append(len(xs)) or inner(xs)
    with torch.no_grad():
        got = cm(a + 1)
        assert seen == [1]
        for k, v in model(a + 1).items():
            close(got[k], v)
        got_b = cm(b)  # another shape: the fast path declines it, then a second program is compiled
        assert len(cm.executables) == 2 and cm._fast is None
        for k, v in model(b).items():
            close(got_b[k], v)


def test_each_signature_is_compiled_once_on_first_call(store, monkeypatch):
    model = DictOut().eval()
    cm = egraft.compile(model, **fast(store))
    assert cm.executables == {}
    builds = []
    real = pipeline.build
    monkeypatch.setattr("egraft.api.compiled.build", lambda *a, **k: builds.append(a[3]) or real(*a, **k))
    a, b = torch.randn(2, 8), torch.randn(3, 5, 8)
    ya = cm(a)
    yb = cm(b)
    ya2 = cm(a + 1)
    assert len(builds) == 2 and list(cm.executables) == ["2x8:float32", "3x5x8:float32"]
    with torch.no_grad():
        for got, x in ((ya, a), (yb, b), (ya2, a + 1)):
            want = model(x)
            assert list(got) == ["logits", "probs", "top"]
            for k in want:
                close(got[k], want[k])


def test_a_signature_past_max_shapes_is_a_clear_error_and_the_others_still_run(store):
    model = DictOut().eval()
    cm = egraft.compile(model, **fast(store, max_shapes=1))
    a = torch.randn(2, 8)
    cm(a)
    with pytest.raises(InputError, match=r"compiled for 1 input signatures already .*max_shapes=N"):
        cm(torch.randn(3, 8))
    with torch.no_grad():
        close(cm(a + 1)["logits"], model(a + 1)["logits"])
    assert list(cm.executables) == ["2x8:float32"]


def test_structured_outputs_and_keyword_inputs(store):
    model = TupleOut().eval()
    x = torch.randn(3, 8)
    cm = egraft.compile(model, example_inputs=x, **fast(store))
    got = cm(x)
    with torch.no_grad():
        want = model(x)
    assert isinstance(got, tuple) and got[1] is None and isinstance(got[2], tuple)
    close(got[0], want[0])
    close(got[2][0], want[2][0])
    close(got[2][1], want[2][1])

    dm = DictOut().eval()
    mask = torch.randn(2, 4)
    cd = egraft.compile(dm, example_inputs=(torch.randn(2, 8),), example_kwargs={"mask": mask, "scale": 0.5},
                        **fast(store))
    x2 = torch.randn(2, 8)
    got = cd(x2, mask=-mask, scale=0.5)
    with torch.no_grad():
        want = dm(x2, mask=-mask, scale=0.5)
    for k in want:
        close(got[k], want[k])
    (name,) = cd.executables
    assert "mask=2x4:float32" in name and "scale=0.5" in name
    cd(x2, mask=mask, scale=2.0)  # another python value is another signature
    assert len(cd.executables) == 2
    # a call is looked up by the program's own signature: its key, the devices, the python values
    for prog in cd.programs.values():
        sig = prog.result.graph.signature
        assert prog.key[0] == sig.key()[:1] and prog.key[2] == (("mask", sig.key()[1], mask.device),)
        assert [s.source for s in sig.call_inputs] == ["x", "mask"]


def test_a_hugging_face_model_output_comes_back_as_a_dict(store):
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            h = self.lin(x)
            return BaseModelOutputWithPooling(last_hidden_state=h, pooler_output=h.mean(1))

    model = Encoder().eval()
    x = torch.randn(2, 3, 8)
    got = egraft.compile(model, example_inputs=x, **fast(store))(x)
    with torch.no_grad():
        want = model(x)
    assert type(got) is dict and list(got) == ["last_hidden_state", "pooler_output"]
    close(got["last_hidden_state"], want.last_hidden_state)
    close(got["pooler_output"], want.pooler_output)


def test_import_egraft_stays_light_and_offers_compile_and_load():
    assert egraft.compile.__module__ == "egraft.api.compiled" and egraft.load.__module__.startswith("egraft.runtime")
    code = ("import sys, egraft; assert 'torch' not in sys.modules and 'jax' not in sys.modules; "
            "assert {'compile', 'load'} <= set(egraft.__all__)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_report_has_the_stages_and_the_speedups(mlp):
    _, _, cm = mlp
    (prog,) = cm.programs.values()
    before = prog.comparison
    assert cm.report("json")["signatures"][0]["comparison"] == before  # reporting measures nothing
    assert prog.comparison is before
    cmp_ = cm.measure()  # measuring is the explicit call
    doc = cm.report("json")
    json.dumps(doc, allow_nan=False)  # strict JSON
    (sig,) = doc["signatures"]
    assert set(sig["stages"]) == {"trace", "saturate", "search", "lower", "validate"}
    assert sig["traced"]["nodes"] > 0 and sig["traced"]["weights"] == 4
    assert sig["chosen"]["backend"] in ("jax", "torch")
    assert sig["validation"]["max_error"] <= max(sig["validation"]["tolerances"])
    assert sig["comparison"] == json.loads(json.dumps(cmp_))
    assert set(cmp_["times"]) >= {"egraft", "eager"}
    assert set(cmp_["speedups"]) >= {"eager"}
    if "torch.compile" not in cmp_["times"]:  # Inductor failed to build here: the report must say why
        assert any("torch.compile" in n for n in cmp_["notes"])
    for v in cmp_["speedups"].values():
        assert v["speedup"] > 0 and (v["conclusive"] or v["why_not"])
    assert cmp_["conditions"]["torch_threads"] == 1 or not cmp_["conditions"]["pinned"]
    text = cm.report()
    for word in ("traced", "saturated", "searched", "chosen", "stages", "trace", "validate", "vs eager",
                 "vs torch.compile"):
        assert word in text, word
    assert cm.report("json")["signatures"][0]["comparison"] == sig["comparison"]  # kept, not measured again


def test_not_measured_and_eager_only(store):
    model = TupleOut().eval()
    x = torch.randn(3, 8)
    cm = egraft.compile(model, example_inputs=x, **fast(store))
    assert cm.report("json")["signatures"][0]["comparison"] is None
    assert "not measured" in cm.report()
    cm.measure(inductor=False)
    assert set(cm.report("json")["signatures"][0]["comparison"]["times"]) == {"egraft", "eager"}


def test_save_and_load_round_trip(mlp, tmp_path):
    model, x, cm = mlp
    path = cm.save(tmp_path / "art")
    art = egraft.load(path)
    xs = torch.randn_like(x[0])
    close(art(xs), cm(xs))
    assert art.manifest["model"] == "MLP"
    assert "signature 4x32:float32" in text_report(art.manifest["report"])  # the record survives JSON


def test_save_several_signatures(store, tmp_path):
    model = DictOut().eval()
    cm = egraft.compile(model, **fast(store))
    with pytest.raises(ArtifactError, match="nothing is compiled"):
        cm.save(tmp_path / "none")
    a, b = torch.randn(2, 8), torch.randn(4, 8)
    cm(a), cm(b)
    root = Path(cm.save(tmp_path / "many"))
    subdirs = sorted(p.name for p in root.iterdir())
    assert subdirs == ["2x8_float32", "4x8_float32"]
    got = egraft.load(root / "4x8_float32")(b)
    close(got["probs"], cm(b)["probs"])
    one = cm.save(tmp_path / "one", signature="2x8:float32")
    close(egraft.load(one)(a)["logits"], cm(a)["logits"])
    with pytest.raises(InputError, match="no compiled signature"):
        cm.save(tmp_path / "bad", signature="9x9:float32")


def test_bad_inputs_are_clear_errors(mlp, store):
    model, x, cm = mlp
    with pytest.raises(InputError, match="nn.Module"):
        egraft.compile(lambda t: t + 1, example_inputs=x)
    with pytest.raises(InputError, match="not a torch.Tensor"):
        egraft.compile(model, example_inputs=(3,), **fast(store))
    with pytest.raises(InputError, match="tensor or a tuple"):
        egraft.compile(model, example_inputs="x", **fast(store))
    with pytest.raises(BackendError, match="unknown device"):
        egraft.compile(model, device="gpu0")
    with pytest.raises(BackendError, match="unknown backend"):
        egraft.compile(model, backend="nope")
    with pytest.raises(InputError, match="unknown option.*'compare'"):
        egraft.compile(model, compare="inductor")  # measuring is CompiledModel.measure(), not an option
    with pytest.raises(InputError, match="egraft.compile: unknown option.*'budgt'.*the options are"):
        egraft.compile(model, budgt=3)
    with pytest.raises(InputError, match="cannot take these inputs"):
        cm(x[0], x[0])
    with pytest.raises(InputError, match="not a torch.Tensor"):
        cm(x[0].numpy())
    with pytest.raises(InputError, match="nothing is compiled"):
        egraft.compile(model, **fast(store)).report()
    with pytest.raises(InputError, match="format"):
        cm.report("yaml")


def test_a_program_that_disagrees_with_eager_is_never_returned(store, monkeypatch):
    from egraft.search.result import SearchResult

    real = SearchResult.executable

    class OffByOne:
        def __init__(self, ex):
            self.ex, self.backend = ex, ex.backend

        def __call__(self, *xs):
            return [o + 1e-3 * o.abs().max() if o.is_floating_point() else o for o in self.ex(*xs)]

    # the executable the search hands the pipeline, made wrong: the check against eager must refuse it
    monkeypatch.setattr(SearchResult, "executable", property(lambda self: OffByOne(real.fget(self))))
    model = TupleOut().eval()
    cm = egraft.compile(model, **fast(store))
    with pytest.raises(ValidationError, match="differs from eager PyTorch"):
        cm(torch.randn(5, 8))
    assert cm.executables == {}


def test_call_overhead_is_printed(mlp):
    """Not a timing assertion (the machine is shared): prints the compiled model's cost over its executable."""
    _, x, cm = mlp
    (ex,) = cm.executables.values()
    close(cm(*x), ex(*x)[0], tol=0.0)

    def per_call(fn, n=300):
        fn()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter_ns() - t0) / n / 1e3)
        return best

    bare, full = per_call(lambda: ex(*x)), per_call(lambda: cm(*x))
    print(f"\ncall: executable {bare:.2f} us, CompiledModel {full:.2f} us, overhead {full - bare:.2f} us")


SCRIPT = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import egraft
    import egraft.backends
    from egraft.models import MODELS
    egraft.compile, egraft.backends.registered()  # the imports a first compile in any process pays, timed apart
    imports = time.perf_counter() - t0
    w = MODELS["mlp"]
    model = w.build("tiny", seed=0)
    x = w.example_inputs(model, seed=0)
    t = time.perf_counter()
    cm = egraft.compile(model, example_inputs=x, fitness="model", budget=1, progress=False)
    total = time.perf_counter() - t
    (res,) = cm.results.values()
    (prog,) = cm.programs.values()
    print(json.dumps({"compile_s": total, "imports_s": imports, "stages": prog.stages, "from_cache": res.from_cache,
                      "egglog": "egglog" in sys.modules}))
""")


@pytest.mark.timing
def test_a_second_process_compiles_from_the_cache(mlp, store, tmp_path):
    """The first compile (the `mlp` fixture) filled the cache; a new process compiling the same model and
    shapes reads it."""
    assert not next(iter(mlp[2].results.values())).from_cache
    env = {**os.environ, "EGRAFT_CACHE_DIR": str(store.root), "PYTHONPATH": str(ROOT)}

    def second_process() -> dict:
        out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                             cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got["from_cache"]
        assert not got["egglog"], "a compile read from the cache loaded the e-graph engine (egglog), which it never runs"
        return got

    def beyond(got: dict) -> float:
        return got["compile_s"] - got["stages"]["trace"]

    # The bound: the cached result is taken (no search), and what remains beyond tracing is lowering (XLA compiles
    # the winner) and checking. The imports every first compile pays (egraft's API, the backends, jax: 2-5 s on a
    # slow 2-core host) are made before the clock starts and reported apart, as is tracing (torch.export's own
    # imports). Measured beyond tracing: 1.2-1.5 s on a 2 GHz Zen 1 host (of which XLA's first lowering 0.6-1.3 s;
    # CI's host failed a 3 s bound at 3.6 s while this count held the API's and egglog's imports), so 3 s.
    bound = 3.0
    second = second_process()
    for _ in range(2):  # timed while another test process shares the two cores: the machine, not egraft, is slow
        if beyond(second) < bound:
            break
        second = min(second, second_process(), key=beyond)
    beyond_trace = beyond(second)
    print(f"\nsecond process: imports {second['imports_s']:.2f} s, compile {second['compile_s']:.2f} s, of which "
          f"trace {second['stages']['trace']:.2f} s; stages {second['stages']}")
    assert beyond_trace < bound, second
