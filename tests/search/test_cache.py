"""The search-result cache (egraft/search/cache.py): keys, round trips, corruption, concurrency, no-op fallback."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import time
import warnings

import pytest

from egraft.search import cache as cache_mod
from egraft.search.cache import Cache, CacheKey, CacheWarning, default_cache, device_id, library_versions

VERSIONS = (("egraft", "0.1.0"), ("torch", "2.5.0"), ("jax", None), ("jaxlib", None), ("triton", "3.1"),
            ("egglog", "13.2.0"))


def _key(**kw) -> CacheKey:
    base = dict(program="abc123", device="cpu", backend="jax", knobs={"idioms": "keep", "tile": 64},
                versions=VERSIONS)
    base.update(kw)
    return CacheKey(**base)


@pytest.fixture()
def cache(tmp_path) -> Cache:
    return Cache(tmp_path / "cache")


def test_round_trip(cache):
    key = _key()
    assert cache.get(key) is None
    value = {"program": "graph text", "cost": 1.5, "choices": [1, 2, 3], "nested": {"a": None}}
    path = cache.put(key, value)
    assert path == cache.path(key) and path.exists() and path.name == f"{key.digest}.json"
    start = time.perf_counter()
    assert cache.get(key) == value
    assert time.perf_counter() - start < 1.0
    # the file carries the metadata
    doc = json.loads(path.read_text())
    assert doc["format"] == cache_mod.FORMAT and doc["digest"] == key.digest
    assert doc["key"]["program"] == "abc123" and isinstance(doc["created"], float)
    # a second put overwrites
    cache.put(key, {"program": "other"})
    assert cache.get(key) == {"program": "other"}
    [entry] = cache.entries()
    assert entry.digest == key.digest and entry.path == path and entry.key == key.fields()
    assert cache.clear() >= 1
    assert cache.get(key) is None and cache.entries() == []


def test_key_sensitivity():
    base = _key()
    variants = [
        _key(program="abc124"),
        _key(device="cuda/NVIDIA H200"),
        _key(backend="triton"),
        _key(knobs=None),
        _key(knobs={"idioms": "primitive", "tile": 64}),
        _key(knobs={"idioms": "keep", "tile": 128}),
    ]
    for i, (name, version) in enumerate(VERSIONS):
        changed = list(VERSIONS)
        changed[i] = (name, "9.9.9" if version is not None else "1.0")
        variants.append(_key(versions=tuple(changed)))
    changed = list(VERSIONS)
    changed[2] = ("jax", "0.4.30")  # a library that appears (None -> version)
    variants.append(_key(versions=tuple(changed)))
    digests = [v.digest for v in variants]
    assert base.digest not in digests
    assert len(set(digests)) == len(digests)
    # canonical: knob order and version order do not matter; the digest is stable
    assert _key(knobs={"tile": 64, "idioms": "keep"}).digest == base.digest
    assert _key(knobs='{"tile": 64, "idioms": "keep"}').digest == base.digest
    assert _key(versions=tuple(reversed(VERSIONS))).digest == base.digest
    assert _key().digest == base.digest and len(base.digest) == 64


def test_a_version_change_is_a_miss(cache):
    cache.put(_key(), {"v": 1})
    newer = dict(VERSIONS) | {"torch": "2.6.0"}
    assert cache.get(_key(versions=tuple(newer.items()))) is None
    assert cache.get(_key()) == {"v": 1}


def test_default_versions_are_read_once():
    versions = dict(library_versions())
    assert set(versions) == set(cache_mod.VERSIONED_LIBRARIES)
    assert versions["egraft"] is not None
    assert library_versions() is library_versions()
    assert dict(CacheKey("p", "cpu", "jax").versions) == versions


def test_device_id():
    assert device_id("cuda:0", "NVIDIA H200") == "cuda/NVIDIA H200"
    assert device_id("cuda:1", "NVIDIA H200") == device_id("cuda", "NVIDIA H200")
    assert device_id("CPU") == "cpu"


def test_bad_keys_and_values(cache):
    with pytest.raises(TypeError):
        CacheKey("", "cpu", "jax")
    with pytest.raises(TypeError):
        cache.put(_key(), [1, 2])  # not a dict
    with pytest.raises((TypeError, ValueError)):
        cache.put(_key(), {"x": object()})
    assert not cache.path(_key()).exists()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json at all",
        b"\xff\xfe\x00garbage",
        b"[1, 2, 3]",
        b'{"format": 1}',
        "truncate",
        "old-format",
        "value-not-dict",
    ],
)
def test_corrupt_entries_are_misses_and_get_rewritten(cache, content):
    key = _key()
    path = cache.put(key, {"result": list(range(100))})
    if content == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif content == "old-format":
        doc = json.loads(path.read_text())
        doc["format"] = cache_mod.FORMAT + 1
        path.write_text(json.dumps(doc))
    elif content == "value-not-dict":
        doc = json.loads(path.read_text())
        doc["value"] = [1, 2]
        path.write_text(json.dumps(doc))
    else:
        path.write_bytes(content)
    with pytest.warns(CacheWarning, match=str(path.name)):
        assert cache.get(key) is None
    assert cache.entries() == []
    cache.put(key, {"result": "fresh"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get(key) == {"result": "fresh"}


def test_an_entry_of_another_key_is_a_miss(cache):
    """A hash collision (or a file copied under the wrong name) holds another key: a miss, then rewritten."""
    mine, other = _key(program="mine"), _key(program="other")
    cache.put(other, {"who": "other"})
    cache.path(other).replace(cache.path(mine))
    with pytest.warns(CacheWarning, match="another key"):
        assert cache.get(mine) is None
    cache.put(mine, {"who": "mine"})
    assert cache.get(mine) == {"who": "mine"}


def _hammer(root: str, worker: int, rounds: int) -> list[str]:
    """Write and read one key many times; report anything that is not a complete value."""
    problems = []
    cache = Cache(root)
    key = _key(program="shared")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(rounds):
            payload = [worker * 100_000 + i * 1_000 + j for j in range(2_000)]
            cache.put(key, {"worker": worker, "round": i, "payload": payload, "total": sum(payload)})
            got = cache.get(key)
            if got is None:
                problems.append(f"worker {worker} round {i}: miss after put")
            elif len(got["payload"]) != 2_000 or sum(got["payload"]) != got["total"]:
                problems.append(f"worker {worker} round {i}: inconsistent value")
    problems += [f"worker {worker}: warning {w.message}" for w in caught]
    return problems


def test_concurrent_writers_and_readers_never_see_a_partial_value(tmp_path):
    root = tmp_path / "shared"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(_hammer, [(str(root), w, 40) for w in range(4)])
    problems = [p for r in results for p in r]
    assert not problems, "\n".join(problems[:20])
    final = Cache(root).get(_key(program="shared"))
    assert final is not None and sum(final["payload"]) == final["total"]
    assert not list(root.glob(".*.tmp")), "temporary files left behind"


def test_env_var_is_honoured(tmp_path, monkeypatch):
    monkeypatch.setenv("EGRAFT_CACHE_DIR", str(tmp_path / "from-env"))
    cache = default_cache()
    assert cache.root == tmp_path / "from-env"
    assert Cache().root == tmp_path / "from-env"
    cache.put(_key(), {"x": 1})
    assert (tmp_path / "from-env" / f"{_key().digest}.json").exists()
    assert default_cache().get(_key()) == {"x": 1}


def test_without_env_var_uses_the_user_cache_dir(monkeypatch):
    import platformdirs

    monkeypatch.delenv("EGRAFT_CACHE_DIR", raising=False)
    assert str(Cache().root) == platformdirs.user_cache_dir("egraft")


def test_unwritable_dir_is_a_noop_with_one_warning(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cache = Cache(blocker / "sub")  # under a regular file: cannot be created, even as root
    key = _key()
    with pytest.warns(CacheWarning, match="cannot be written") as record:
        path = cache.put(key, {"x": 1})
    assert len([w for w in record if issubclass(w.category, CacheWarning)]) == 1
    assert path == cache.path(key) and cache.disabled
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, nothing raises
        cache.put(key, {"x": 2})
        assert cache.get(key) is None
        assert cache.entries() == []
        assert cache.clear() == 0
        # another object on the same root: still only the one warning per process
        Cache(blocker / "sub").put(key, {"x": 3})


def test_keys_are_frozen():
    key = _key()
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.program = "x"  # type: ignore[misc]
    assert hash(key) == hash(_key())
