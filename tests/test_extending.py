"""docs/extending.md, run: every worked example there is executed as written.

Each ```python block runs in a fresh namespace, in document order; a block
headed with a file name (```python numpy_runner.py) is written to that file
in a temporary directory on ``sys.path`` and imported as that module, as a
contributor's files would be.  What a block registers (a lowering rule, a
backend) and the modules it becomes are removed afterwards, so the rest of the
suite never sees them.  The backend example is then put through the whole
backend conformance suite, as a real backend would be, and through what its
record promises: ``auto`` picks it when it is the only backend, the cost model
prices its plan, and a fresh process loads its artifact without the compiler.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from egraft import backends
from egraft.backends.base import BACKENDS
from egraft.errors import BackendError
from egraft.frontend.lowering import LOWERINGS
from egraft.ir import GraphBuilder, Group, evaluate
from egraft.testing import assert_close, fresh_seed

ROOT = str(Path(__file__).resolve().parents[1])
DOC = Path(ROOT) / "docs" / "extending.md"
BLOCKS = re.findall(r"```python(?: (\S+))?\n(.*?)```", DOC.read_text(), flags=re.S)  # (file name or "", code)
MODULES = ("numpy_runner", "numpy_backend")  # the backend example's two files, in import order
COMPILER = ("egglog", "deap", "egraft.frontend", "egraft.rewrites", "egraft.search", "egraft.backends",
            "egraft.ir.egraph", "egraft.testing")


@pytest.fixture
def registries():
    """Whatever an example registers is gone after it."""
    lowerings, registered = dict(LOWERINGS), dict(BACKENDS)
    yield
    LOWERINGS.clear()
    LOWERINGS.update(lowerings)
    BACKENDS.clear()
    BACKENDS.update(registered)


@pytest.fixture
def numpy_backend(registries, tmp_path, monkeypatch):
    """The backend example's modules, written to `tmp_path` and imported (dropped again afterwards)."""
    files = {name: code for name, code in BLOCKS if name}
    assert sorted(files) == sorted(f"{m}.py" for m in MODULES), f"the backend example's files: {sorted(files)}"
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        mods = [importlib.import_module(m) for m in MODULES]
        yield tmp_path, mods[-1]
    finally:
        for m in MODULES:
            sys.modules.pop(m, None)


def _run(k: int) -> dict:
    name, code = BLOCKS[k]
    assert not name, f"block {k} is the file {name}: it is imported, not run"
    namespace = {"__name__": f"extending_example_{k}"}
    exec(compile(code, f"{DOC}:block{k}", "exec"), namespace)
    return namespace


def _graph():
    b = GraphBuilder()
    x = b.input("x", (3, 8), "float32")
    w = b.weight("w", np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    return b.build([((x @ w).exp2() * 0.5).sum(1)]), np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)


def test_the_doc_has_the_three_examples():
    assert [n for n, _ in BLOCKS] == ["", "", "numpy_runner.py", "numpy_backend.py"], (
        "docs/extending.md should hold the lowering and rewrite examples and the backend's two files, found "
        f"{[n or 'code' for n, _ in BLOCKS]}")


def test_example_lowering(registries):
    assert "aten.logcumsumexp" not in LOWERINGS, "egraft now lowers logcumsumexp: pick another op for the example"
    _run(0)
    assert "aten.logcumsumexp" in LOWERINGS


def test_example_rewrite_rule(registries):
    ns = _run(1)
    assert ns["SIN_ODD"].family == "algebra"


def test_example_backend_passes_the_conformance_suite(numpy_backend, monkeypatch):
    assert "numpy" in BACKENDS
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent / "backends"))
    from conformance import all_cases

    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    for case in all_cases():
        graph = case.graph()
        inputs = case.inputs(graph, rng)
        got = backends.lower(graph, "numpy", "cpu")(*inputs)
        assert_close(got, evaluate(graph, inputs), [d for _, d in graph.output_types()], tol=case.tol,
                     what=f"{case.name} on the example numpy backend (seed={seed})")


def test_auto_picks_the_example_backend_only_where_its_priority_wins(numpy_backend, monkeypatch):
    from egraft.search import estimate

    g, x = _graph()
    record = BACKENDS["numpy"]
    # among egraft's own, its priority 0 puts it last: auto does not pick it
    assert backends.candidates("auto", "cpu")[-1] == "numpy" and "numpy" not in backends.candidates("auto", "cuda")
    assert backends.lower(g, "auto", "cpu").backend == "jax"
    # the only backend that imports here (egraft's own hidden): auto, the lowering and the cost model take it
    monkeypatch.setattr(backends, "NAMES", ())
    BACKENDS.clear()  # (the registries fixture restores it)
    BACKENDS["numpy"] = record
    assert backends.candidates("auto", "cpu") == ["numpy"]
    ex = backends.lower(g, "auto", "cpu")
    assert ex.backend == "numpy" and isinstance(ex, numpy_backend[1].NumpyExecutable)
    assert_close(ex(x), evaluate(g, [x]), ["float32"], what="auto -> the numpy backend")
    auto, named = estimate(g, "auto", device="cpu"), estimate(g, "numpy", device="cpu")
    assert auto == named and len(named.kernels) == len(record.plan(g, {}).roots)
    with pytest.raises(BackendError, match="no registered backend runs on 'cuda'"):
        backends.candidates("auto", "cuda")  # it runs on cpu only
    # egraft's own back (re-registered from their packages): a priority above JAX's puts it first
    monkeypatch.undo()
    BACKENDS["numpy"] = dataclasses.replace(record, devices={"cpu": 100})
    assert backends.candidates("auto", "cpu")[:2] == ["numpy", "jax"]
    assert backends.resolve("auto", "cpu") == "numpy" and backends.candidates("auto", "tpu") == ["jax"]


def test_the_cost_model_prices_the_example_plan_kernel_by_kernel(numpy_backend):
    from egraft.measure import DeviceSpec
    from egraft.search import estimate

    g, _ = _graph()
    spec = DeviceSpec("test spec", {"float32": 1e12}, 1e11)
    plan = BACKENDS["numpy"].plan(g, {})
    e = estimate(g, "numpy", device="cpu", spec=spec)
    computed = [n.op for n in plan.graph.nodes if n.op not in Group.LEAF]
    assert [k.ops for k in e.kernels if k.ops] == [(op,) for op in computed if op not in Group.MOVEMENT]
    assert len(e.kernels) == len(computed) > len(estimate(g, "jax", device="cpu", spec=spec).kernels)
    assert e.bound_s == pytest.approx(sum(k.bound_s for k in e.kernels)) and e.bound_s > 0


def test_example_backend_saves_and_a_fresh_process_loads_it_without_the_compiler(numpy_backend):
    from egraft.backends.artifact import save_artifact
    from egraft.runtime import load

    tmp, _ = numpy_backend
    g, x = _graph()
    ex = backends.lower(g, "numpy", "cpu")
    d = save_artifact(ex, str(tmp / "art"))
    art = load(d)
    assert art.manifest["target"] == {"device": "cpu", "backend": "numpy", "loader": "numpy_runner"}
    want = evaluate(g, [x])
    assert_close(art(x), want, ["float32"], what="loaded numpy artifact")
    np.save(tmp / "x.npy", x)
    code = (
        "import sys, numpy as np\n"
        "import egraft.runtime\n"
        f"art = egraft.runtime.load({d!r})\n"
        f"np.save(sys.argv[1], art(np.load({str(tmp / 'x.npy')!r}))[0])\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({COMPILER!r}) or m == 'numpy_backend')\n"
        "print('LOADED', bad)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, str(tmp), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", code, str(tmp / "out.npy")], capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env=env)
    assert "LOADED []" in p.stdout, p.stdout + p.stderr
    assert_close([np.load(tmp / "out.npy")], want, ["float32"], what="fresh process vs reference")
