"""The backend records: what a record must hold, and the lists derived from the registry.

``auto`` and the search's candidates come from the records' device priorities,
ordered highest first, among the backends that import here; a named backend
is checked to run on the device.  (The example numpy backend of
docs/extending.md is put through auto, the cost model and save/load in
tests/test_extending.py.)
"""

from __future__ import annotations

import dataclasses

import pytest

from egraft import backends
from egraft.backends.artifact import save_artifact
from egraft.backends.base import BACKENDS, Backend
from egraft.errors import BackendError
from egraft.ir import GraphBuilder


@pytest.fixture
def registry():
    saved = dict(BACKENDS)
    yield BACKENDS
    BACKENDS.clear()
    BACKENDS.update(saved)


def _graph():
    b = GraphBuilder()
    x = b.input("x", (3,), "float32")
    return b.build([x.exp2()])


def _auto(device: str) -> list[str]:
    return [n for n in backends.candidates("auto", device) if n in ("jax", "torch", "triton")]


def test_own_backends_are_the_packages_and_keep_the_order_auto_had():
    assert {"jax", "torch", "triton"} <= set(backends.NAMES)
    assert _auto("cuda") == ["triton", "jax", "torch"]
    assert _auto("cpu") == ["jax", "torch"]  # Triton runs on cpu (its interpreter) only when named
    assert _auto("tpu") == ["jax"]
    assert backends.resolve("auto", "cuda:1") == "triton" and backends.resolve("auto", "cpu") == "jax"
    assert backends.candidates("triton", "cpu") == ["triton"]


def test_the_records_hold_the_search_facts():
    rec = {n: backends.get_backend(n) for n in ("jax", "torch", "triton")}
    assert {n for n, b in rec.items() if b.recomputes} == {"triton"}
    assert {(n, k): v for n, b in rec.items() for k, v in b.late_knobs.items()} == {("torch", "mode"): "inductor"}
    for n, b in rec.items():
        assert b.writer == f"egraft.backends.{n}.export" and b.loader == f"egraft.runtime.{n}_loader"
        assert all(k in b.knobs(_graph()) for k in b.late_knobs), n


def test_a_named_backend_is_checked():
    with pytest.raises(BackendError, match="does not run on 'tpu'"):
        backends.candidates("torch", "tpu")
    with pytest.raises(BackendError, match=r"unknown backend 'tvm'; the registered backends are jax, "):
        backends.candidates("tvm", "cpu")
    with pytest.raises(BackendError, match="unknown device"):
        backends.candidates("auto", "gpu")


def test_a_backend_that_does_not_import_is_left_out_of_auto_and_named_when_asked_for(registry, monkeypatch):
    monkeypatch.setitem(backends._UNAVAILABLE, "torch", "ImportError: No module named 'torch'")
    registry.pop("torch")
    assert _auto("cpu") == ["jax"]
    with pytest.raises(BackendError, match=r"torch backend cannot be imported here \(ImportError"):
        backends.get_backend("torch")
    for name in backends.NAMES:
        registry.pop(name, None)
        monkeypatch.setitem(backends._UNAVAILABLE, name, f"ImportError: No module named {name!r}")
    with pytest.raises(BackendError, match=r"no registered backend runs on 'cpu' here; jax: ImportError.*; torch: "):
        backends.candidates("auto", "cpu")


def test_priorities_order_auto_and_ties_go_by_name(registry):
    jax = backends.get_backend("jax")
    registry["zz"] = dataclasses.replace(jax, name="zz", devices={"cpu": 20})
    registry["aa"] = dataclasses.replace(jax, name="aa", devices={"cpu": 15, "tpu": None})
    assert _auto("cpu") == ["jax", "torch"] and backends.candidates("auto", "cpu")[:4] == ["jax", "zz", "aa", "torch"]
    assert "aa" not in backends.candidates("auto", "tpu")


@pytest.mark.parametrize("bad, match", [
    (dict(devices=("cpu",)), "devices maps device kinds"),
    (dict(devices={"gpu": 1}), r"devices\['gpu'\]"),
    (dict(devices={"cpu": "high"}), r"devices\['cpu'\] = 'high'"),
    (dict(name="auto"), "other than 'auto'"),
    (dict(writer="m.export", loader=None), "both an artifact writer and a loader"),
])
def test_a_malformed_record_is_refused(bad, match):
    with pytest.raises(BackendError, match=match):
        dataclasses.replace(backends.get_backend("jax"), **bad)


def test_the_records_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        backends.get_backend("jax").recomputes = True
    with pytest.raises(TypeError):
        backends.get_backend("torch").late_knobs["mode"] = "eager"


def test_saving_a_backend_without_a_writer_says_so(registry, tmp_path):
    registry["nowriter"] = dataclasses.replace(backends.get_backend("jax"), name="nowriter", writer=None, loader=None)
    ex = backends.lower(_graph(), "jax", "cpu")
    ex.backend = "nowriter"
    with pytest.raises(BackendError, match=r"backend 'nowriter'.*names no artifact writer.*save: jax, torch"):
        save_artifact(ex, str(tmp_path / "art"))
    assert not (tmp_path / "art").exists()
