"""weights.safetensors: every IR dtype (bfloat16 included) round trips bit for bit; a broken file is named."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from egraft.errors import ArtifactError
from egraft.ir import dtypes
from egraft.runtime.weights import check_weights, parse_weights, write_weights
from egraft.testing import fresh_seed, random_array


def _arrays(rng):
    out = {f"w_{dt}": random_array((3, 5), dt, rng) for dt in dtypes.DTYPES}
    out["scalar"] = np.array(2.5, np.float32)  # 0-d stays 0-d
    out["empty"] = np.zeros((0, 4), np.float32)
    out["strided"] = random_array((6, 4), "float32", rng).T  # written contiguous
    return out


def test_round_trip_every_dtype(tmp_path):
    rng = np.random.default_rng(fresh_seed())
    arrays = _arrays(rng)
    path = str(tmp_path / "w.safetensors")
    write_weights(path, arrays)
    back = parse_weights(bytearray(open(path, "rb").read()), path)
    assert set(back) == set(arrays)
    for name, a in arrays.items():
        b = back[name]
        assert b.shape == a.shape and b.dtype == a.dtype, name
        assert b.tobytes() == np.ascontiguousarray(a).tobytes(), name
    specs = [{"name": n, "shape": list(a.shape), "dtype": dtypes.from_numpy(a.dtype)} for n, a in arrays.items()]
    assert [x.shape for x in check_weights(back, specs, path)] == [a.shape for a in arrays.values()]
    with pytest.raises(ArtifactError, match="lacks the weight 'nope'"):
        check_weights(back, [{"name": "nope", "shape": [1], "dtype": "float32"}], path)


def test_the_safetensors_library_reads_what_is_written(tmp_path):
    """The file is standard safetensors: the library itself reads it (float32 here; bfloat16 via torch)."""
    import torch
    from safetensors.torch import load_file

    rng = np.random.default_rng(fresh_seed())
    a = random_array((4, 3), "float32", rng)
    bf = random_array((2, 2), "bfloat16", rng)
    path = str(tmp_path / "w.safetensors")
    write_weights(path, {"a": a, "bf": bf})
    t = load_file(path)
    assert np.array_equal(t["a"].numpy(), a)
    assert t["bf"].dtype == torch.bfloat16
    assert np.array_equal(t["bf"].float().numpy(), bf.astype(np.float32))


def test_broken_files_are_named(tmp_path):
    path = str(tmp_path / "w.safetensors")
    with pytest.raises(ArtifactError, match="w.safetensors is not a valid safetensors file .*shorter"):
        parse_weights(bytearray(b"abc"), path)
    with pytest.raises(ArtifactError, match="header length"):
        parse_weights(bytearray(struct.pack("<Q", 10**6) + b"{}"), path)
    header = b'{"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'
    with pytest.raises(ArtifactError, match="offsets 0..16 that do not fit"):
        parse_weights(bytearray(struct.pack("<Q", len(header)) + header + b"\0" * 8), path)
    header = b'{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}'
    with pytest.raises(ArtifactError, match="unreadable entry"):
        parse_weights(bytearray(struct.pack("<Q", len(header)) + header + b"\0"), path)
