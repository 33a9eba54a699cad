"""runtime.derived: a form derived from weights is made once while its sources and a holder live, tells how it was
made, and is remade from that recipe exactly; the aligned weights file stays a safetensors file."""

from __future__ import annotations

import gc
import json
import os

import ml_dtypes
import numpy as np
import pytest

from egraft.errors import ArtifactError
from egraft.ir.tensors import ALIGN
from egraft.runtime import derived
from egraft.runtime.weights import map_weights, parse_weights, write_weights


@pytest.fixture
def rng(_egraft_seed):
    return np.random.default_rng(_egraft_seed)


def _weight(rng, shape=(24, 40)):
    return rng.standard_normal(shape).astype(np.float32)


def test_the_same_recipe_over_the_same_arrays_is_made_once(rng):
    w = _weight(rng)
    params = {"width": 16, "transposed": True}
    a = derived.derived("panels", params, (w,), ("w",))
    assert derived.derived("panels", dict(params), (w,), ("w",)) is a  # equal params: the same array
    assert derived.derived("panels", {"width": 8, "transposed": True}, (w,)) is not a  # another recipe
    assert derived.derived("panels", params, (w.copy(),)) is not a  # equal values, another array: its own
    assert not a.flags.writeable and a.ctypes.data % ALIGN == 0
    want = np.concatenate([w.T, np.zeros((40, 8), np.float32)], 1).reshape(40, 2, 16).transpose(1, 0, 2)
    np.testing.assert_array_equal(a, want)  # panels of 16 columns of the [N, K] weight read as [K, N], padded


def test_an_entry_lives_while_a_holder_and_its_sources_do(rng):
    w = _weight(rng)
    a = derived.derived("panels", {"width": 16, "transposed": False}, (w,))
    first = id(a)
    del a
    gc.collect()
    b = derived.derived("panels", {"width": 16, "transposed": False}, (w,))
    assert derived.provenance(b) is not None  # a new entry, made again (the old one died with its last holder)
    held = derived.stats()["held"]
    del w
    gc.collect()
    assert derived.provenance(b) is None and derived.stats()["held"] < held  # its source died: no reuse by id
    assert isinstance(first, int)


def test_provenance_and_build_remake_the_array_exactly(rng):
    from egraft.backends.fold import compute_folded, plan
    from egraft.ir.builder import GraphBuilder
    from egraft.ir.tensor_movement import cat

    b = GraphBuilder()
    x = b.input("x", (3, 8), "float32")
    wq, wk = b.weight("wq", _weight(rng, (8, 8))), b.weight("wk", _weight(rng, (8, 8)))
    both = cat([wq, wk], 1)  # weight-only: folded
    g = b.build([x.matmul(both)])
    p = plan(g)
    (name, value), = compute_folded(p).items()
    recipe, params, sources = derived.provenance(value)
    assert recipe == "fold" and sorted(n for n, _ in sources) == ["wk", "wq"]
    assert all(s is g.weights[n] for n, s in sources)
    stored = {n: s.copy() for n, s in sources}  # as a loaded file would give them: other arrays, same values
    tree = {"recipe": recipe, "params": json.dumps(params),
            "sources": [[n, {"tensor": n}] for n, _ in sources]}
    again = derived.build(tree, stored.__getitem__, "test")
    np.testing.assert_array_equal(again, value)
    assert derived.build(tree, stored.__getitem__, "test") is again  # a second program: the same array


def test_an_unknown_or_broken_recipe_is_an_artifact_error(rng):
    tensors = {"w": _weight(rng)}
    with pytest.raises(ArtifactError, match="recipe 'mystery', which this egraft does not know"):
        derived.build({"recipe": "mystery", "params": "{}", "sources": [["w", {"tensor": "w"}]]}, tensors.get, "x")
    with pytest.raises(ArtifactError, match="recipe is malformed"):
        derived.build({"recipe": "panels", "sources": []}, tensors.get, "x")
    with pytest.raises(ArtifactError, match="remaking a weight by recipe 'panels' failed"):
        derived.build({"recipe": "panels", "params": "{}", "sources": [["w", {"tensor": "w"}]]}, tensors.get, "x")


def test_the_weights_file_is_aligned_safetensors(tmp_path, rng):
    arrays = {"odd": rng.standard_normal(7).astype(np.float32),  # 28 bytes: stored after the aligned ones
              "a": _weight(rng), "bf": _weight(rng, (4, 16)).astype(ml_dtypes.bfloat16),
              "i": rng.integers(-5, 5, (16,)).astype(np.int64)}
    path = str(tmp_path / "w.safetensors")
    write_weights(path, arrays)
    mapped = map_weights(path)
    for name, a in arrays.items():
        np.testing.assert_array_equal(mapped[name], a)
        assert mapped[name].dtype == a.dtype and not mapped[name].flags.writeable
    assert all(mapped[n].ctypes.data % ALIGN == 0 for n in ("a", "bf", "i"))
    from safetensors.numpy import load_file  # the format's own reader takes it (it has no bfloat16)

    os.remove(path)
    write_weights(path, {k: v for k, v in arrays.items() if k != "bf"})
    theirs = load_file(path)
    assert sorted(theirs) == ["a", "i", "odd"] and np.array_equal(theirs["odd"], arrays["odd"])
    assert parse_weights(bytearray(open(path, "rb").read()), path).keys() == theirs.keys()


def test_a_modified_or_missing_weights_file_is_named(tmp_path, rng):
    path = str(tmp_path / "w.safetensors")
    write_weights(path, {"a": _weight(rng)})
    from egraft.runtime.manifest import sha256_file

    sha = sha256_file(path)
    with open(path, "r+b") as f:  # one byte of the data changed
        f.seek(os.path.getsize(path) - 3)
        byte = f.read(1)[0]
        f.seek(os.path.getsize(path) - 3)
        f.write(bytes([byte ^ 0xFF]))
    with pytest.raises(ArtifactError, match="was modified after the artifact was written.*save the model again"):
        map_weights(path, sha, "save the model again")
    with pytest.raises(ArtifactError, match="is missing from the artifact"):
        map_weights(str(tmp_path / "nope.safetensors"), sha)
