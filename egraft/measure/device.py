"""Which device a measurement runs on, and whether that device exists here.

One parser for the device strings the rest of egraft uses (``"cpu"``,
``"cuda"``, ``"cuda:N"``, ``"tpu"``), so the timing dispatch and the spec
lookup agree on what a string means.  ``egraft.measure`` sits beside the backends
in the layer order and may not import them, so it has its own parser with
the same accepted forms as ``backends.base.device_kind``.

torch and jax are imported only inside :func:`available`: detecting a GPU
must not make ``import egraft.measure`` heavy.
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


def parse(device: str | Device) -> Device:
    """Parse a device string; a malformed one raises :class:`egraft.errors.BackendError` (as the backends do) naming the forms."""
    if isinstance(device, Device):
        return device
    text = str(device).strip().lower()
    kind, sep, idx = text.partition(":")
    bad = BackendError(f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' (N a GPU index) or 'tpu'")
    if kind not in KINDS:
        raise bad
    if not sep:
        return Device(kind)
    if kind != "cuda" or not idx.isdigit():
        raise bad
    return Device(kind, int(idx))


def available(device: str | Device) -> bool:
    """Whether `device` exists on this machine (a bad string is still an error, not False)."""
    d = parse(device)
    if d.kind == "cpu":
        return True
    if d.kind == "cuda":
        try:
            import torch
        except ImportError:
            return False
        if not torch.cuda.is_available():
            return False
        return d.index is None or d.index < torch.cuda.device_count()
    try:
        import jax
    except ImportError:
        return False
    try:
        return len(jax.devices("tpu")) > 0
    except RuntimeError:  # jax raises when no backend of that platform is present
        return False


def require(device: str | Device) -> Device:
    """Parse `device` and fail clearly if it is not present here."""
    d = parse(device)
    if not available(d):
        raise BackendError(f"device {str(d)!r} is not available on this machine; time on 'cpu' or run on a host with it")
    return d
