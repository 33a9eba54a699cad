"""An artifact's weights: ``weights.safetensors``, written with safetensors and read back zero-copy.

The file holds what the program uses per call (values folded at build
included), under their weight names, in the dtypes the program takes them;
a saved generation holds one such file for all its step programs, each
tensor once (``backends.artifact.WeightStore``).

The format is safetensors' (8-byte little-endian header length, a JSON
header of name -> dtype / shape / byte offsets, then the data, no holes), written
and parsed here because safetensors' numpy binding has no bfloat16, and
because of two choices safetensors leaves open:

* **aligned data.**  The header is padded with spaces (the format allows
  it) so the data starts on a 64-byte boundary, and tensors whose byte size
  is a multiple of 64 come first, so each of them starts on one too: XLA's
  CPU client then uses a tensor where it lies instead of copying it
  (``ir.tensors.ALIGN``);
* **memory-mapped reads.**  :func:`map_weights` checks the file's SHA-256
  (streamed; or the one remembered for the unchanged file, ``runtime.hashed``)
  and maps it read-only: the arrays are views of the page cache,
  shared by every program that binds them, so loading costs about the
  weights' size in memory once, and nothing more per program.  Weights a
  CPU reads are, asked for (``EGRAFT_HUGE_PAGES=1``), read instead into
  memory the kernel may back with 2 MiB pages, where it offers them
  (``runtime.huge_pages``: a decode step streams every weight, and 4 KiB
  pages cost it up to 10 %); the same views, shared the same way, private
  to the process.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Mapping

import numpy as np

from ..errors import ArtifactError
from ..ir import dtypes
from ..ir.tensors import ALIGN
from .hashed import known_sha256

WEIGHTS_FILE = "weights.safetensors"

# safetensors dtype codes <-> IR dtype names
_CODES = {r.safetensors: d for d, r in dtypes.ROWS.items()}
_HEADER_MAX = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


def write_weights(path: str, arrays: Mapping[str, np.ndarray]) -> str:
    """Write `arrays` (name -> array in an IR dtype) to the safetensors file `path` (aligned: the module docstring);
    the SHA-256 of the bytes written (hashed as they are written: no second read of gigabytes)."""
    clean = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        dtypes.from_numpy(a.dtype)  # an IRError for a dtype the IR does not have
        clean[name] = a
    order = sorted(clean, key=lambda n: clean[n].nbytes % ALIGN != 0)  # stable: aligned sizes first
    header: dict = {"__metadata__": {"format": "egraft"}}
    offset = 0
    for name in order:
        a = clean[name]
        header[name] = {"dtype": dtypes.row(dtypes.from_numpy(a.dtype)).safetensors, "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-(8 + len(text))) % ALIGN)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for piece in [struct.pack("<Q", len(text)), text]:
            h.update(piece)
            f.write(piece)
        for name in order:
            piece = memoryview(np.ascontiguousarray(clean[name]).reshape(-1).view(np.uint8))
            h.update(piece)
            f.write(piece)
    return h.hexdigest()


def map_weights(path: str, sha256: str | None = None, remedy: str = "rebuild it with `egraft compile`",
                huge_pages: bool = False) -> dict[str, np.ndarray]:
    """name -> read-only array views of the safetensors file `path`, memory-mapped (the module docstring); with
    `huge_pages` (weights a CPU reads) read instead into memory the kernel may back with huge pages, where
    ``runtime.huge_pages.offered`` (faster to stream; private to the process).

    With `sha256`, the file's hash is checked first (ArtifactError naming the file if it differs, and `remedy`)."""
    from . import huge_pages as hp

    if not os.path.isfile(path):
        raise ArtifactError(f"{path} is missing from the artifact; copy the whole directory (or {remedy})")
    wanted = huge_pages and hp.offered() and os.path.getsize(path) >= hp.HUGE_PAGE
    read = hp.read_file(path) if wanted else None
    if sha256 is not None and (read[1] if read else known_sha256(path)) != sha256:
        raise ArtifactError(f"{path} was modified after the artifact was written (its SHA-256 differs from the "
                            f"one recorded): {remedy}")
    if os.path.getsize(path) == 0:
        raise ArtifactError(f"{path} is not a valid safetensors file (empty); {remedy}")
    return parse_weights(read[0] if read else np.memmap(path, dtype=np.uint8, mode="r"), path)


def parse_weights(data: bytearray, path: str) -> dict[str, np.ndarray]:
    """name -> array views of the safetensors bytes `data` (read from `path`, named in errors)."""
    def bad(why: str) -> ArtifactError:
        return ArtifactError(f"{path} is not a valid safetensors file ({why}); rebuild the artifact with `egraft compile`")

    if len(data) < 8:
        raise bad("shorter than its header")
    (n,) = struct.unpack("<Q", bytes(data[:8]))  # (data: a bytearray, or a read-only memmap)
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
    """The arrays in the manifest's order, each checked against its entry (name, shape, dtype).

    In a program of a saved generation an entry names its ``tensor`` in the shared file, or the recipe that
    ``derived`` it from such tensors (``runtime.derived.build``, made once for every program); else its name."""
    from .derived import build

    def tensor(key: str) -> np.ndarray:
        a = arrays.get(key)
        if a is None:
            raise ArtifactError(f"{path} lacks the weight {key!r} the manifest lists; "
                                "rebuild the artifact with `egraft compile`")
        return a

    out = []
    for spec in specs:
        a = build(spec["derived"], tensor, path) if "derived" in spec else tensor(spec.get("tensor", spec["name"]))
        if list(a.shape) != list(spec["shape"]) or dtypes.from_numpy(a.dtype) != spec["dtype"]:
            raise ArtifactError(f"{path}: weight {spec['name']!r} is {tuple(a.shape)}:{dtypes.from_numpy(a.dtype)}, "
                                f"the manifest says {tuple(spec['shape'])}:{spec['dtype']}; rebuild the artifact")
        out.append(a)
    return out


__all__ = ["WEIGHTS_FILE", "check_weights", "map_weights", "parse_weights", "write_weights"]
