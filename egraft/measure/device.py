"""Which device a measurement runs on, and whether that device exists here.

Device strings are parsed by the one parser, :func:`egraft.runtime.device.parse`
(re-exported here); this module adds whether a device exists on this machine.

torch and jax are imported only inside :func:`available`: detecting a GPU
must not make ``import egraft.measure`` heavy.
"""

from __future__ import annotations

from ..errors import BackendError
from ..runtime.device import KINDS, Device, parse

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
