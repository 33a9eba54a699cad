"""Python's garbage collector paused while an artifact loads (``egraft.runtime.gc_pause``): off inside every load,
restored as it was after the outermost one (nested and concurrent loads, errors, a collector already off)."""

from __future__ import annotations

import gc
import threading

import pytest
from runtime_helpers import build

from egraft.errors import ArtifactError
from egraft.runtime import gc_pause, load


@pytest.fixture
def collector(monkeypatch):
    monkeypatch.delenv(gc_pause.ENV_VAR, raising=False)
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("before", [True, False])
def test_paused_inside_and_restored_as_it_was(collector, before):
    (gc.enable if before else gc.disable)()
    with gc_pause.paused():
        assert not gc.isenabled()
        with gc_pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # (an inner load's end does not turn it back on)
    assert gc.isenabled() is before
    with pytest.raises(RuntimeError):
        with gc_pause.paused():
            raise RuntimeError("a failed load")
    assert gc.isenabled() is before


def test_loads_in_two_threads_restore_it_once_both_end(collector):
    gc.enable()
    inside, leave = threading.Barrier(2), threading.Event()

    def first():
        with gc_pause.paused():
            inside.wait()
            leave.wait()

    t = threading.Thread(target=first)
    t.start()
    with gc_pause.paused():
        inside.wait()
    assert not gc.isenabled()  # (this thread's load ended, the other's has not)
    leave.set()
    t.join()
    assert gc.isenabled()


def test_env_var_leaves_it_running(collector, monkeypatch):
    gc.enable()
    monkeypatch.setenv(gc_pause.ENV_VAR, "1")
    with gc_pause.paused():
        assert gc.isenabled()


def test_egraft_load_runs_with_it_paused_and_restores_it(collector, tmp_path, monkeypatch):
    *_, d = build("mlp", "jax", str(tmp_path / "art"))
    from egraft.runtime import jax_loader

    seen = []
    real = jax_loader.load
    monkeypatch.setattr(jax_loader, "load", lambda *a, **k: seen.append(gc.isenabled()) or real(*a, **k))
    gc.enable()
    assert load(d).runner is not None and seen == [False] and gc.isenabled()
    with pytest.raises(ArtifactError):
        load(str(tmp_path / "missing"))
    assert gc.isenabled()
