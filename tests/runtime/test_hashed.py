"""A file's SHA-256 remembered by its identity and times (``egraft.runtime.hashed``): reused while the file is
unchanged, recomputed after any write, never trusted from a record made in the same moment as the file."""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import pytest

from egraft.errors import ArtifactError
from egraft.runtime import hashed
from egraft.runtime.weights import map_weights, write_weights


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """The cache under `tmp_path`, and a list that grows by one each time a file is actually read and hashed."""
    monkeypatch.setenv("EGRAFT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(hashed.ENV_VAR, raising=False)
    reads = []
    real = hashed.sha256_file
    monkeypatch.setattr(hashed, "sha256_file", lambda p: reads.append(p) or real(p))
    return reads


def _file(path, seed: int, n: int = 1 << 16) -> str:
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _flip_last_byte_keeping_mtime(path) -> None:
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the modification time set back; the change time moves


def test_a_settled_record_is_reused_and_any_write_is_seen(counted, monkeypatch, tmp_path):
    monkeypatch.setattr(hashed, "SETTLED", 0.0)  # (a record counts at once: the file was written before it)
    path = tmp_path / "w.bin"
    want = _file(path, seed=int(time.time_ns() % 2**31))
    assert hashed.known_sha256(str(path)) == want and len(counted) == 1
    assert hashed.known_sha256(str(path)) == want and len(counted) == 1  # from the record: not read again
    time.sleep(0.05)  # (past the file clock's tick: the write below gets a later change time)
    _flip_last_byte_keeping_mtime(path)
    got = hashed.known_sha256(str(path))
    assert got != want and got == hashlib.sha256(path.read_bytes()).hexdigest() and len(counted) == 2


def test_a_record_made_as_the_file_was_written_is_not_trusted(counted, tmp_path):
    path = tmp_path / "w.bin"
    want = _file(path, seed=7)
    for k in range(3):  # (written under SETTLED seconds before each record: hashed every time)
        assert hashed.known_sha256(str(path)) == want and len(counted) == k + 1


def test_rehash_env_var_and_an_unwritable_cache(counted, monkeypatch, tmp_path):
    monkeypatch.setattr(hashed, "SETTLED", 0.0)
    path = tmp_path / "w.bin"
    want = _file(path, seed=11)
    monkeypatch.setenv(hashed.ENV_VAR, "1")
    assert [hashed.known_sha256(str(path)) for _ in range(2)] == [want, want] and len(counted) == 2
    assert not (tmp_path / "cache" / "hashed").exists()  # nothing recorded
    monkeypatch.delenv(hashed.ENV_VAR)
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    monkeypatch.setenv("EGRAFT_CACHE_DIR", str(blocker))  # the records cannot be written: only the hash is paid
    assert [hashed.known_sha256(str(path)) for _ in range(2)] == [want, want] and len(counted) == 4


def test_a_corrupt_record_is_ignored(counted, monkeypatch, tmp_path):
    monkeypatch.setattr(hashed, "SETTLED", 0.0)
    path = tmp_path / "w.bin"
    want = _file(path, seed=13)
    hashed.known_sha256(str(path))
    (record,) = (tmp_path / "cache" / "hashed").iterdir()
    record.write_text('{"sha256": 5')
    assert hashed.known_sha256(str(path)) == want and len(counted) == 2


def test_mapped_weights_modified_after_a_record_are_refused(counted, monkeypatch, tmp_path):
    monkeypatch.setattr(hashed, "SETTLED", 0.0)
    rng = np.random.default_rng(int(time.time_ns() % 2**31))
    path = tmp_path / "weights.safetensors"
    sha = write_weights(str(path), {"w": rng.standard_normal((8, 16)).astype(np.float32),
                                    "b": rng.standard_normal(5).astype(np.float16)})
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()  # (hashed as written: the file's own hash)
    first = map_weights(str(path), sha)
    again = map_weights(str(path), sha)
    assert len(counted) == 1 and np.array_equal(first["w"], again["w"])
    del first, again
    time.sleep(0.05)
    _flip_last_byte_keeping_mtime(path)
    with pytest.raises(ArtifactError, match="was modified after the artifact was written"):
        map_weights(str(path), sha)


def test_a_file_egraft_wrote_and_moved_into_place_is_not_read_again(counted, tmp_path):
    rng = np.random.default_rng(int(time.time_ns() % 2**31))
    stage = tmp_path / ".stage"
    stage.mkdir()
    sha = write_weights(str(stage / "weights.safetensors"), {"w": rng.standard_normal((8, 16)).astype(np.float32)})
    written = os.stat(stage / "weights.safetensors")
    os.rename(stage, tmp_path / "art")  # (as a save commits its staging directory)
    path = tmp_path / "art" / "weights.safetensors"
    hashed.remember_written(str(path), sha, written)
    assert map_weights(str(path), sha)["w"].shape == (8, 16) and counted == []  # no byte read for the hash
    time.sleep(0.05)
    _flip_last_byte_keeping_mtime(path)
    with pytest.raises(ArtifactError, match="was modified after the artifact was written"):
        map_weights(str(path), sha)
    assert counted == [str(path)]


def test_a_written_record_needs_the_file_unchanged_since_its_writing_ended(counted, monkeypatch, tmp_path):
    path = tmp_path / "w.bin"
    want = _file(path, seed=17)
    written = os.stat(path)
    time.sleep(0.05)
    _flip_last_byte_keeping_mtime(path)  # written again after the stat its writer took: nothing recorded
    hashed.remember_written(str(path), want, written)
    assert hashed.known_sha256(str(path)) == hashlib.sha256(path.read_bytes()).hexdigest() != want
    assert len(counted) == 1
    other = tmp_path / "v.bin"
    sha = _file(other, seed=19)
    monkeypatch.setenv(hashed.ENV_VAR, "1")  # EGRAFT_REHASH: nothing recorded, every load hashes
    hashed.remember_written(str(other), sha, os.stat(other))
    monkeypatch.delenv(hashed.ENV_VAR)
    assert hashed.known_sha256(str(other)) == sha and len(counted) == 2


def test_a_saved_program_records_its_weights_hash_from_the_write(counted, tmp_path):
    from runtime_helpers import build

    from egraft.runtime import load
    from egraft.runtime.manifest import read_manifest
    from egraft.runtime.weights import WEIGHTS_FILE

    *_, d = build("mlp", "jax", str(tmp_path / "art"))
    path = os.path.join(d, WEIGHTS_FILE)
    with open(path, "rb") as f:
        assert read_manifest(d)["files"][WEIGHTS_FILE] == hashlib.sha256(f.read()).hexdigest()
    load(d)
    assert path not in counted and os.path.realpath(path) not in counted
