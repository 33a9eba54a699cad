"""An artifact's weights: ``weights.safetensors``, written with safetensors and read back zero-copy.

The file holds what the program uses per call (values folded at build
included), under their weight names, in the dtypes the program takes them.
Writing goes through ``safetensors.numpy.save_file`` (it accepts ml_dtypes'
bfloat16 by its dtype name).  Reading parses the format here (8-byte
little-endian header length, a JSON header of name -> dtype / shape / byte
offsets, then the data) because safetensors' numpy binding has no bfloat16,
and because the bytes read once serve both the SHA-256 check and the arrays
(``numpy.frombuffer`` views of one buffer, no second copy, no window between
checking and parsing).
"""

from __future__ import annotations

import json
import struct
from typing import Mapping

import numpy as np

from ..errors import ArtifactError
from ..ir import dtypes

WEIGHTS_FILE = "weights.safetensors"

# safetensors dtype codes <-> IR dtype names
_CODES = {r.safetensors: d for d, r in dtypes.ROWS.items()}
_HEADER_MAX = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


def write_weights(path: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Write `arrays` (name -> array in an IR dtype) to the safetensors file `path`."""
    from safetensors.numpy import save_file

    clean = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        a = a if a.flags.c_contiguous else a.copy(order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
        dtypes.from_numpy(a.dtype)  # an IRError for a dtype the IR does not have
        clean[name] = a
    save_file(clean, path, metadata={"format": "egraft"})


def parse_weights(data: bytearray, path: str) -> dict[str, np.ndarray]:
    """name -> array views of the safetensors bytes `data` (read from `path`, named in errors)."""
    def bad(why: str) -> ArtifactError:
        return ArtifactError(f"{path} is not a valid safetensors file ({why}); rebuild the artifact with `egraft compile`")

    if len(data) < 8:
        raise bad("shorter than its header")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > min(_HEADER_MAX, len(data) - 8):
        raise bad(f"header length {n} exceeds the file")
    try:
        header = json.loads(bytes(data[8:8 + n]))
    except ValueError as e:
        raise bad(f"header is not JSON: {e}") from None
    base, size = 8 + n, len(data) - 8 - n
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            dt = dtypes.to_numpy(_CODES[spec["dtype"]])
            shape = tuple(int(s) for s in spec["shape"])
            start, end = (int(o) for o in spec["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise bad(f"tensor {name!r} has an unreadable entry {spec!r:.200}") from None
        count = int(np.prod(shape, dtype=np.int64))
        if not 0 <= start <= end <= size or end - start != count * dt.itemsize:
            raise bad(f"tensor {name!r} has offsets {start}..{end} that do not fit {shape}:{dt.name}")
        out[name] = np.frombuffer(data, dtype=dt, count=count, offset=base + start).reshape(shape)
    return out


def check_weights(arrays: Mapping[str, np.ndarray], specs: list[dict], path: str) -> list[np.ndarray]:
    """The arrays in the manifest's order, each checked against its entry (name, shape, dtype)."""
    out = []
    for spec in specs:
        a = arrays.get(spec["name"])
        if a is None:
            raise ArtifactError(f"{path} lacks the weight {spec['name']!r} the manifest lists; "
                                "rebuild the artifact with `egraft compile`")
        if list(a.shape) != list(spec["shape"]) or dtypes.from_numpy(a.dtype) != spec["dtype"]:
            raise ArtifactError(f"{path}: weight {spec['name']!r} is {tuple(a.shape)}:{dtypes.from_numpy(a.dtype)}, "
                                f"the manifest says {tuple(spec['shape'])}:{spec['dtype']}; rebuild the artifact")
        out.append(a)
    return out


__all__ = ["WEIGHTS_FILE", "check_weights", "parse_weights", "write_weights"]
