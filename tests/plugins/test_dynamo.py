"""The egraft TorchDynamo backend: entry point, fallback, dynamic shapes, weight updates, options, safety.

The models here are small on purpose; what is checked is what the backend
does around the compiler: which graph pieces egraft runs, what falls back to
PyTorch and how loudly, and that every result equals eager PyTorch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from importlib.metadata import entry_points

import pytest
import torch
from torch import nn

from egraft.errors import InputError
from egraft.plugins.dynamo import EgraftFallbackWarning, egraft_backend
from egraft.plugins.dynamo import DEFAULTS, WHERE
from egraft.search.config import ENV_VAR, CompileConfig
from egraft.search import Budget
from egraft.testing import fresh_seed, rel_err
from plugin_helpers import FAST, fallback_messages



class ErfinvMLP(nn.Module):
    """Linear, tanh, erfinv (no lowering rule in egraft), Linear: egraft takes the pieces around erfinv."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return torch.relu(self.b(torch.erfinv(torch.tanh(self.a(x)) * 0.9) * 0.5)) + 1.0


class SpectralMLP(nn.Module):
    """An FFT in the middle: complex values egraft's IR has no dtype for."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d // 2 + 1, d)

    def forward(self, x):
        return self.b(torch.fft.rfft(torch.tanh(self.a(x))).abs() * 2.0).sigmoid()


class Counter(nn.Module):
    """Mutates a buffer in place every call (the shape of a KV-cache update)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return self.lin(x) * self.calls


def _capture(options=None):
    """A backend that records the DynamoGraphs egraft_backend returns."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(egraft_backend(gm, example_inputs, options=options or FAST))
        return graphs[-1]

    return backend, graphs


def _run(compiled, model, inputs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in inputs:
            with torch.no_grad():
                got, want = compiled(x), model(x)
            assert got.shape == want.shape and rel_err(got.numpy(), want.numpy()) < 1e-4
    return fallback_messages(caught)


# --- the entry point -----------------------------------------------------------------------------

def test_entry_point_is_registered():
    (ep,) = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "egraft"]
    assert ep.value == "egraft.plugins.dynamo:egraft_backend"
    assert ep.load() is egraft_backend
    assert "egraft" in torch._dynamo.list_backends()


def test_entry_point_works_in_a_fresh_process_without_importing_egraft(tmp_path):
    script = textwrap.dedent(f"""
        import json, sys, torch
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
        x = torch.randn(3, 8)
        before = sorted(k for k in sys.modules if k.split(".")[0] == "egraft")
        f = torch.compile(m, backend="egraft", options=json.loads({json.dumps(FAST)!r}))
        with torch.no_grad():
            got, want = f(x), m(x)
        err = ((got - want).abs().max() / want.abs().max()).item()
        print(json.dumps({{"before": before, "err": err, "loaded": "egraft.plugins.dynamo" in sys.modules}}))
    """)
    env = {**os.environ, "EGRAFT_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("PYTHONPATH", None)  # egraft must come from its installation (and its entry points)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["before"] == [], "the script imported egraft before torch.compile did"
    assert result["loaded"], "torch did not load egraft's backend through the entry point"
    assert result["err"] < 1e-4


# --- fallback to PyTorch -----------------------------------------------------------------------

def test_unsupported_op_runs_in_pytorch_with_one_warning():
    seed = fresh_seed()
    torch.manual_seed(seed)
    model = ErfinvMLP().eval()
    backend, graphs = _capture()
    compiled = torch.compile(model, backend=backend)
    g = torch.Generator().manual_seed(seed)
    messages = _run(compiled, model, [torch.randn(2, 8, generator=g) for _ in range(3)])
    assert len(messages) == 1, messages
    assert "aten.erfinv.default" in messages[0]
    assert os.path.basename(__file__) in messages[0], "the warning names the model's source line"
    (graph,) = graphs
    (entry,) = graph.entries.values()
    assert list(entry.fallback_ops) == ["aten.erfinv.default"]
    assert len(entry.results) == 2, "the pieces before and after erfinv are compiled by egraft"


def test_complex_values_run_in_pytorch():
    seed = fresh_seed()
    torch.manual_seed(seed)
    model = SpectralMLP().eval()
    backend, graphs = _capture()
    g = torch.Generator().manual_seed(seed)
    messages = _run(torch.compile(model, backend=backend), model, [torch.randn(2, 8, generator=g)])
    assert len(messages) == 1 and "aten._fft_r2c.default" in messages[0], messages
    assert "complex64" in messages[0]
    (entry,) = graphs[0].entries.values()
    assert entry.results, "the real-valued pieces are still compiled by egraft"


def test_graph_with_nothing_egraft_can_take_runs_in_pytorch():
    def fn(x):
        return torch.erfinv(x * 0.5)

    g = torch.Generator().manual_seed(fresh_seed())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.rand(4, generator=g)
        got = torch.compile(fn, backend="egraft", options=FAST)(x)
    assert torch.equal(got, fn(x))
    (message,) = fallback_messages(caught)
    assert "runs in PyTorch" in message and "aten.erfinv.default" in message


def test_state_mutation_is_compiled_and_mutates_once_per_call():
    """The buffer Dynamo passes in is written as state, in place, once per call (tests/plugins/test_dynamo_static_cache.py)."""
    torch.manual_seed(fresh_seed())
    model, twin = Counter().eval(), Counter().eval()
    twin.load_state_dict(model.state_dict())
    backend, graphs = _capture(FAST)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            for _ in range(2):
                assert torch.allclose(compiled(x), twin(x), rtol=1e-6, atol=1e-6)
    assert model.calls.item() == twin.calls.item() == 2.0
    assert fallback_messages(caught) == [] and sum(g.compiles for g in graphs) == 1


def test_an_input_dtype_egraft_lacks_runs_in_pytorch():
    def fn(img):
        return img.float() * (1 / 255)

    img = torch.randint(0, 256, (2, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(fresh_seed()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(fn, backend="egraft", options=FAST)(img)
    assert torch.equal(got, fn(img))
    (message,) = fallback_messages(caught)
    assert "uint8" in message


def test_a_wrong_compiled_program_is_never_returned(monkeypatch):
    """If the compiled program disagrees with PyTorch, the graph runs in PyTorch with a warning."""
    from egraft.search.result import SearchResult

    real = SearchResult.executable

    class OffByOne:
        def __init__(self, exe):
            self.exe, self.backend = exe, exe.backend

        def __call__(self, *xs):
            return self.run_torch(list(xs))

        def run_torch(self, xs):
            return [o + 1 for o in self.exe.run_torch(xs)]

    # the executable the search hands the pipeline, made wrong: the pipeline's check must refuse it
    monkeypatch.setattr(SearchResult, "executable", property(lambda self: OffByOne(real.fget(self))))
    torch.manual_seed(fresh_seed())
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    messages = _run(torch.compile(model, backend="egraft", options=FAST), model, [torch.randn(2, 8)] * 2)
    assert len(messages) == 1 and "does not match PyTorch" in messages[0], messages


# --- shapes and weights --------------------------------------------------------------------------

def test_dynamic_shapes_are_compiled_per_signature():
    """dynamic="per_size" (the default pads to buckets: tests/plugins/test_buckets.py)."""
    torch.manual_seed(fresh_seed())
    model = nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Linear(16, 8)).eval()
    backend, graphs = _capture({**FAST, "max_shapes": 2, "dynamic": "per_size"})
    compiled = torch.compile(model, backend=backend, dynamic=True)
    messages = _run(compiled, model, [torch.randn(n, 8) for n in (2, 3, 3, 5)])
    (graph,) = graphs
    assert any(isinstance(n.meta.get("example_value"), torch.SymInt) for n in graph._names), "not a dynamic graph"
    compiled_keys = [k for k, e in graph.entries.items() if e.run is not None]
    assert len(compiled_keys) == 2, "two shapes compiled (max_shapes=2)"
    # one notice when the dynamic graph first compiles (what each size costs, what that means in generation),
    # one when max_shapes is reached
    assert len(messages) == 2, messages
    assert "dynamic" in messages[0] and "cache_implementation" in messages[0] and "max_shapes=2" in messages[0]
    assert "max_shapes" in messages[1]


def test_updated_weights_are_seen():
    torch.manual_seed(fresh_seed())
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4)).eval()
    compiled = torch.compile(model, backend="egraft", options=FAST)
    x = torch.randn(3, 8)
    assert _run(compiled, model, [x]) == []
    with torch.no_grad():
        model[0].weight.mul_(-2.0)  # in place: same tensor, new version
    assert _run(compiled, model, [x]) == []
    model[2].weight = nn.Parameter(torch.randn(4, 8))  # replaced: another tensor
    assert _run(compiled, model, [x]) == []


def test_inference_mode():
    """vLLM runs models under torch.inference_mode; weights made there have no version counter."""
    torch.manual_seed(fresh_seed())
    with torch.inference_mode():
        model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4)).eval()
        compiled = torch.compile(model, backend="egraft", options=FAST)
        for n in (2, 2):
            x = torch.randn(n, 8)
            got, want = compiled(x), model(x)
            assert rel_err(got.numpy(), want.numpy()) < 1e-4


def test_bfloat16_model():
    torch.manual_seed(fresh_seed())
    model = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 16)).to(torch.bfloat16).eval()
    x = torch.randn(4, 16).to(torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got, want = torch.compile(model, backend="egraft", options=FAST)(x), model(x)
    assert fallback_messages(caught) == [], "a bfloat16 program is checked with the bfloat16 tolerance"
    assert got.dtype == torch.bfloat16 and rel_err(got.float().numpy(), want.float().numpy()) < 5e-2


# --- options -------------------------------------------------------------------------------------

def parse(options=None, **kw):
    """The backend's options as the backend parses them (its defaults, the environment, the options)."""
    return CompileConfig.parse(options, env=True, where=WHERE, defaults=DEFAULTS, **kw)


def test_options_are_checked():
    assert parse().budget == Budget(seconds=10.0) and parse().device is None  # the backend's own defaults
    assert parse({"budget": {"seconds": None, "trials": 3}}).budget == Budget(seconds=None, trials=3)
    assert parse({"budget": "20s"}).budget.share(0.5).seconds == 10.0
    assert parse({"limits": {"iterations": 2}}).limits.iterations == 2
    with pytest.raises(InputError, match="torch.compile backend: unknown option.*'budgt'.*budget"):
        parse({"budgt": 3})
    with pytest.raises(InputError, match="budget"):
        parse({"budget": "soon"})
    with pytest.raises(InputError, match="fitness"):
        parse({"fitness": "fast"})
    with pytest.raises(InputError, match="limits"):
        parse({"limits": {"iters": 2}})
    with pytest.raises(InputError, match="Inductor"):
        egraft_backend(None, [], None, mode="max-autotune")


def test_options_from_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_VAR, json.dumps({"budget": "5s", "seed": 3}))
    opts = parse({"seed": 4})
    assert opts.budget.seconds == 5.0 and opts.seed == 4  # passed options win key by key, over the defaults
    monkeypatch.setenv(ENV_VAR, "{budget: 5}")
    with pytest.raises(InputError, match=ENV_VAR):
        parse(None)


def test_a_bad_option_fails_the_compile():
    model = nn.Linear(4, 4).eval()
    with pytest.raises(Exception, match="egraft torch.compile backend: unknown option"):
        torch.compile(model, backend="egraft", options={"budgt": 1})(torch.randn(2, 4))
