"""Weights read into memory the kernel may back with huge pages (runtime.huge_pages): the same bytes, read-only,
the file's hash checked, the mapped file where it is not offered."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from egraft.errors import ArtifactError
from egraft.runtime import huge_pages
from egraft.runtime.weights import map_weights, write_weights
from egraft.testing import fresh_seed, random_array

needs_thp = pytest.mark.skipif(not huge_pages.host_offers(), reason="no transparent huge pages on this host")


def _file(tmp_path, rng):
    """A weights file over 2 MiB (the size from which weights are read into huge pages), three dtypes."""
    arrays = {"big": random_array((768, 1024), "float32", rng), "bf": random_array((64, 48), "bfloat16", rng),
              "odd": random_array((3, 5), "int8", rng)}
    path = str(tmp_path / "w.safetensors")
    write_weights(path, arrays)
    return path, arrays, hashlib.sha256(open(path, "rb").read()).hexdigest()


def _is_mapped_file(a: np.ndarray) -> bool:
    while a is not None:
        if isinstance(a, np.memmap):
            return True
        a = a.base if isinstance(a, np.ndarray) else None
    return False


@needs_thp
def test_read_file_gives_the_files_bytes_read_only_on_a_huge_page_boundary(tmp_path):
    path, _, digest = _file(tmp_path, np.random.default_rng(fresh_seed()))
    data, got = huge_pages.read_file(path)
    assert got == digest
    assert data.tobytes() == open(path, "rb").read()
    assert data.ctypes.data % huge_pages.HUGE_PAGE == 0
    assert not data.flags.writeable


@pytest.mark.parametrize("env", ["1", "0"])
def test_weights_read_either_way_are_the_same_read_only_arrays(tmp_path, monkeypatch, env):
    monkeypatch.setenv("EGRAFT_HUGE_PAGES", env)
    path, arrays, digest = _file(tmp_path, np.random.default_rng(fresh_seed()))
    got = map_weights(path, digest, huge_pages=True)
    assert set(got) == set(arrays)
    for name, a in arrays.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape
        assert got[name].tobytes() == a.tobytes(), name
        assert not got[name].flags.writeable
    read_into_memory = env == "1" and huge_pages.offered()
    assert _is_mapped_file(got["big"]) != read_into_memory
    assert _is_mapped_file(map_weights(path, digest)["big"])  # (not asked: the file stays mapped)


@pytest.mark.parametrize("env", ["1", "0"])
def test_a_modified_file_is_refused_either_way(tmp_path, monkeypatch, env):
    monkeypatch.setenv("EGRAFT_HUGE_PAGES", env)
    path, _, digest = _file(tmp_path, np.random.default_rng(fresh_seed()))
    with open(path, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(ArtifactError, match="modified after the artifact was written"):
        map_weights(path, digest, huge_pages=True)


def test_offered_only_when_asked_for(monkeypatch):
    monkeypatch.delenv("EGRAFT_HUGE_PAGES", raising=False)
    assert not huge_pages.offered()  # (the default: the mapped file)
    monkeypatch.setenv("EGRAFT_HUGE_PAGES", "0")
    assert not huge_pages.offered()
    monkeypatch.setenv("EGRAFT_HUGE_PAGES", "1")
    assert huge_pages.offered() == huge_pages.host_offers()


@needs_thp
def test_a_loaded_cpu_artifact_runs_from_weights_read_into_memory(tmp_path, monkeypatch):
    """An artifact with over 2 MiB of weights, loaded for the CPU: its weights are read (not mapped), and it
    computes what the mapped load and PyTorch compute."""
    import torch

    import egraft

    monkeypatch.setenv("EGRAFT_HUGE_PAGES", "1")
    reads = []
    real = huge_pages.read_file
    monkeypatch.setattr(huge_pages, "read_file", lambda p: reads.append(p) or real(p))
    torch.manual_seed(fresh_seed())
    model = torch.nn.Sequential(torch.nn.Linear(1024, 768), torch.nn.GELU()).eval()
    x = torch.randn(3, 1024)
    cm = egraft.compile(model, example_inputs=(x,), backend="jax", budget="2s", progress=False)
    cm.save(str(tmp_path / "a"))
    read = egraft.load(str(tmp_path / "a"))
    assert len(reads) == 1
    monkeypatch.setenv("EGRAFT_HUGE_PAGES", "0")
    mapped = egraft.load(str(tmp_path / "a"))
    assert len(reads) == 1
    got, again = read(x), mapped(x)
    assert torch.equal(got, again)
    torch.testing.assert_close(got, model(x).detach(), rtol=1e-4, atol=1e-5)
