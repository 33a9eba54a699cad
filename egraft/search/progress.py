"""The live progress line of a search: a rich progress bar on a terminal, nothing elsewhere.

``Progress`` is a context manager.  By default (``enabled=None``) it is on
only when its stream (``sys.stderr`` unless given) is a terminal, so tests,
CI logs and pipes stay quiet.  When disabled, every method returns at once
and rich is never imported.  The line reads::

    ⠋ search ━━━━━╺━━━━ gen 7 143 timed best 1.23 ms speed-up 1.87x over direct

The bar's fraction is ``max(elapsed / budget_s, trials done / trials)`` and
advances on its own with the clock; it takes the width the text leaves.
With neither a budget nor a trial count, the spinner and the elapsed time
show instead.  The live display is stopped on the way out of the
``with`` block even when an exception or a KeyboardInterrupt goes through it
(the exception is not swallowed).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from .report import fmt_time


def _positive(x: float | int | None) -> float | None:
    try:
        return float(x) if x is not None and math.isfinite(x) and x > 0 else None
    except TypeError:
        return None


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # noqa: BLE001 - a stream without isatty, or a closed one, is not a terminal
        return False


class Progress:
    """A search's progress bar.  See the module docstring."""

    def __init__(self, budget_s: float | None = None, trials: int | None = None, enabled: bool | None = None,
                 label: str = "search", stream: Any = None) -> None:
        self._default_stream = stream is None
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _is_tty(self.stream) if enabled is None else bool(enabled)
        self.budget_s = _positive(budget_s)
        self.trials = _positive(trials)
        self.label = label
        self._live: Any = None  # rich.progress.Progress while the display runs
        self._task: Any = None
        self._start = 0.0
        self._done = 0

    # --- what the line shows ----------------------------------------------------------------------

    @property
    def bounded(self) -> bool:
        """A fraction can be shown (a time budget or a trial count is known)."""
        return self.budget_s is not None or self.trials is not None

    def fraction(self) -> float:
        """How much of the budget is spent: the larger of time and trials, in [0, 1]."""
        parts = []
        if self.budget_s is not None and self._start:
            parts.append((time.monotonic() - self._start) / self.budget_s)
        if self.trials is not None:
            parts.append(self._done / self.trials)
        return min(1.0, max([0.0] + parts))

    @staticmethod
    def _fields(generation: int, timed: int, best_s: float, baseline_s: float) -> dict[str, str]:
        finite = _positive(best_s) is not None
        if finite and _positive(baseline_s) is not None:
            speedup = f"speed-up {baseline_s / best_s:.2f}x over direct"
        else:
            speedup = "speed-up -"
        return {"gen": f"gen {generation}", "timed": f"{timed} timed",
                "best": f"best {fmt_time(best_s) if finite else '-'}", "speedup": speedup}

    # --- the display ------------------------------------------------------------------------------

    def _columns(self) -> list:
        from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress_bar import ProgressBar

        owner = self

        class _BudgetBar(BarColumn):
            """The bar, filled from the clock and the trial count at every refresh."""

            def render(self, task):  # noqa: ANN001 - rich's Task
                return ProgressBar(total=1.0, completed=owner.fraction(),
                                   width=None if self.bar_width is None else max(1, self.bar_width),
                                   animation_time=task.get_time(), style=self.style,
                                   complete_style=self.complete_style, finished_style=self.finished_style,
                                   pulse_style=self.pulse_style)

        cols: list = [SpinnerColumn(), TextColumn("{task.description}", markup=False)]
        # the bar takes the width the text leaves (expand=True); unbounded, the elapsed time shows instead
        cols.append(_BudgetBar(bar_width=None) if self.bounded else TimeElapsedColumn())
        cols += [TextColumn("{task.fields[%s]}" % k, markup=False) for k in ("gen", "timed", "best", "speedup")]
        return cols

    def __enter__(self) -> Progress:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import Progress as RichProgress

        console = Console(file=self.stream, force_terminal=True)
        self._live = RichProgress(*self._columns(), console=console, refresh_per_second=4, transient=False,
                                  expand=self.bounded, redirect_stdout=self._default_stream,
                                  redirect_stderr=self._default_stream)
        self._start = time.monotonic()
        self._task = self._live.add_task(self.label, total=None,
                                         **self._fields(0, 0, math.inf, math.nan) | {"gen": "gen -"})
        self._live.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:  # noqa: ANN001
        self.close()
        return False  # never swallow the exception (KeyboardInterrupt included)

    def close(self) -> None:
        """Stop the live display (idempotent; ``__exit__`` calls it)."""
        live, self._live = self._live, None
        if live is not None:
            live.stop()

    def update(self, generation: int, trials: int, timed: int, best_s: float, baseline_s: float,
               block: str = "") -> None:
        """The state after a generation: distinct candidates so far, how many were timed, the best time."""
        if self._live is None:
            return
        self._done = trials
        desc = f"{self.label} [{block}]" if block else self.label
        self._live.update(self._task, description=desc, **self._fields(generation, timed, best_s, baseline_s))

    def note(self, msg: str) -> None:
        """A line printed above the bar (nothing when disabled)."""
        if not self.enabled:
            return
        if self._live is not None:
            self._live.console.print(msg, markup=False, highlight=False)
        else:
            print(msg, file=self.stream)
