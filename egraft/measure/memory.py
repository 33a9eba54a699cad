"""Which compile stage set the process's peak memory.

``with ledger() as led:`` around a compile; each stage calls
:func:`mark` with its name when it ends.  A mark reads the process's peak
resident memory so far (``VmHWM`` on Linux, ``ru_maxrss`` elsewhere) and
charges its rise since the previous mark to that stage: ``led.rises`` is
bytes per stage name (summed over its runs), ``led.peak`` the peak at the
last mark.  The peak only ever rises, so the stages with a rise are the
ones that set it, whatever ran before the compile.  Outside a ledger
:func:`mark` does nothing.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

_CURRENT: list["Ledger"] = []  # the ledgers open in this process, innermost last


def peak_rss() -> int | None:
    """The process's peak resident set so far, bytes (None where the platform does not say)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB elsewhere
    except (ImportError, OSError):
        return None


def reset_peak() -> bool:
    """Set the process's peak RSS back to its present RSS (Linux's ``clear_refs``), so that what a caller measures
    next starts from here; False where the platform cannot.  A benchmark's call: egraft itself never resets it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclass
class Ledger:
    """Peak-memory rises charged to the stages that ended after them (module docstring)."""

    start: int | None = None
    peak: int | None = None
    rises: dict[str, int] = field(default_factory=dict)

    def mark(self, stage: str) -> None:
        now = peak_rss()
        if now is None:
            return
        before = self.peak if self.peak is not None else self.start if self.start is not None else now
        if now > before:
            self.rises[stage] = self.rises.get(stage, 0) + now - before
        self.peak = max(now, before)

    def report(self) -> dict:
        """``{"peak_rss": bytes, "at_start": bytes, "rise_by_stage": {stage: bytes}}`` (largest rise first)."""
        return {"peak_rss": self.peak, "at_start": self.start,
                "rise_by_stage": dict(sorted(self.rises.items(), key=lambda kv: -kv[1]))}


@contextmanager
def ledger():
    led = Ledger(start=peak_rss())
    _CURRENT.append(led)
    try:
        yield led
    finally:
        _CURRENT.remove(led)


def mark(stage: str) -> None:
    """Charge the peak's rise since the last mark to `stage`, in every open ledger (none open: nothing)."""
    for led in _CURRENT:
        led.mark(stage)


__all__ = ["Ledger", "ledger", "mark", "peak_rss", "reset_peak"]
