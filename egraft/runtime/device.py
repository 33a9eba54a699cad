"""The one parser of device strings: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"tpu"``.

Everything that takes a device (the backends, the measurements, the runtime
loading an artifact) parses it here, so they agree on what a string means.
It sits in the runtime, the lowest layer that runs programs, so that the
backends and ``egraft.measure`` above it and the light runtime itself share
it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BackendError

KINDS = ("cpu", "cuda", "tpu")


@dataclass(frozen=True)
class Device:
    """A parsed device: its kind and, for ``cuda:N``, the index (None means the default one)."""

    kind: str
    index: int | None = None

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def parse(device, error: type = BackendError) -> Device:
    """Parse a device string; a malformed one raises `error` (:class:`BackendError` unless given) naming the forms."""
    if isinstance(device, Device):
        return device
    text = str(device).strip().lower()
    kind, sep, idx = text.partition(":")
    if kind in KINDS and (not sep or (kind == "cuda" and idx.isdigit())):
        return Device(kind, int(idx) if sep else None)
    raise error(f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' (N a GPU index) or 'tpu'")


__all__ = ["Device", "KINDS", "parse"]
