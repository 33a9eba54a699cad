"""A SearchResult shown to a person: a text report, a JSON record, or a PNG of the search.

``render(result, format, path)`` is what ``SearchResult.report()`` calls.
``"text"`` is a compact human report (what was chosen, how much faster it is
than the direct lowering and how sure that is, how the search went);
``"json"`` is ``result.summary()`` as strict JSON (no NaN / Infinity tokens);
``"png"`` plots the best time found against the number of candidates
evaluated, with the direct lowering and the roofline bound as lines.
matplotlib is imported only for ``"png"``, and only its object API is used
(``Figure`` + the Agg canvas): the user's pyplot state and backend are left
alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .statuses import COUNT_KEYS

# egraft.search.result imports this module (SearchResult.report), so nothing is imported back from it,
# not even for typing (the architecture test counts that as an import circle): duck-typed aliases.
SearchResult = Any
Trial = Any

FORMATS = ("text", "json", "png")
HISTORY_ROWS = 12  # generations shown in the text report's table; the middle is elided beyond


def render(result: SearchResult, format: str = "text", path: str | None = None) -> str:  # noqa: A002
    """The result as ``"text"`` or ``"json"`` (returned, and written to `path` when given) or
    ``"png"`` (written to `path`, which is required; the path is returned)."""
    if format == "text":
        out = text_report(result)
    elif format == "json":
        out = json_report(result)
    elif format == "png":
        if not path:
            raise ValueError('report(format="png") needs a path to write the image to, e.g. '
                             'result.report("png", "search.png")')
        return png_report(result, path)
    else:
        raise ValueError(f"unknown report format {format!r}: valid formats are {', '.join(map(repr, FORMATS))}")
    if path:
        Path(path).write_text(out if out.endswith("\n") else out + "\n", encoding="utf-8")
    return out


# --- formatting helpers ---------------------------------------------------------------------------

def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def fmt_time(s: float) -> str:
    """Seconds with a readable unit: ``12.3 µs``, ``4.56 ms``, ``1.20 s``; ``n/a`` when not finite."""
    if not _finite(s):
        return "n/a"
    a = abs(s)
    if a == 0:
        return "0 s"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if a >= scale * 0.9995:  # 0.99996 s is "1 s", not "1e+03 ms"
            break
    v = s / scale
    return f"{v:.3g} {unit}" if abs(v) < 1000 else f"{v:.0f} {unit}"


def fmt_spread(x: float) -> str:
    """A relative spread as ``±4.2%``; ``±n/a`` when not a finite number."""
    return f"±{100 * x:.1f}%" if _finite(x) else "±n/a"


def _timing(t: float, spread: float, estimated: bool) -> str:
    if not _finite(t):
        return "n/a"
    return fmt_time(t) + ("" if estimated else f" {fmt_spread(spread)}")


def _speedup_line(result: SearchResult) -> str:
    x = result.speedup
    if not _finite(x):
        return "n/a (a time is missing)"
    if x >= 1:
        return f"{x:.2f}x over direct lowering"
    return f"{x:.2f}x: slower than direct lowering"


def _compared_line(result: SearchResult) -> str:
    """The final comparison's contenders, fastest first (label and median)."""
    rows = sorted(result.compared, key=lambda r: r["time_s"] if _finite(r["time_s"]) else math.inf)
    return ", ".join(f"{r['label']} {fmt_time(r['time_s'])}" for r in rows)


def _kv(d: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) if d else "defaults"


def _counts_line(counts: dict) -> str:
    keys = [k for k in COUNT_KEYS if k in counts] + [k for k in counts if k not in COUNT_KEYS]
    return ", ".join(f"{counts[k]} {k}" for k in keys) if keys else "none recorded"


def _blocks_line(blocks: dict) -> str:
    d, n = blocks.get("distinct"), blocks.get("occurrences")
    parts = []
    if d is not None:
        parts.append(f"{d} distinct block{'s' if d != 1 else ''} searched")
    if n is not None:
        parts.append(f"{n} occurrence{'s' if n != 1 else ''} in the program")
    parts += [f"{k}={v}" for k, v in blocks.items() if k not in ("distinct", "occurrences")]
    return ", ".join(parts)


def _history_table(result: SearchResult) -> list[str]:
    gens = list(result.history)
    with_block = any(g.block for g in gens)
    head = ["gen"] + (["block"] if with_block else []) + ["best", "trials", "timed", "rejected", "cached", "elapsed"]
    rows = []
    for g in gens:
        rows.append([str(g.index)] + ([g.block or "-"] if with_block else []) + [
            fmt_time(g.best_s) if _finite(g.best_s) else "-", str(g.trials), str(g.timed), str(g.rejected),
            str(g.cached), fmt_time(g.elapsed_s)])
    if len(rows) > HISTORY_ROWS:
        k = HISTORY_ROWS // 3
        skipped = len(rows) - HISTORY_ROWS + 1
        rows = rows[:k] + [["…"] + [""] * (len(head) - 1)] + rows[-(HISTORY_ROWS - k - 1):]
        note = f"    ({skipped} generations elided)"
    else:
        note = ""
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = ["    " + "  ".join(c.rjust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
    return lines + ([note] if note else [])


def text_report(result: SearchResult) -> str:
    """The compact human report."""
    est = result.estimated
    lines = ["egraft search result"]

    def row(name: str, value: str) -> None:
        lines.append(f"  {name:<12}{value}")

    row("device", str(result.device))
    row("backend", f"{result.backend}  (knobs: {_kv(result.knobs)})")
    if est:
        row("fitness", "model: times are estimated by the cost model, not measured")
    else:
        row("fitness", "measured (medians of interleaved runs, ± relative spread)")
    row("chosen", _timing(result.time_s, result.spread, est))
    row("direct", _timing(result.baseline_time_s, result.baseline_spread, est)
        + "  (the input program, the backend's default knobs)")
    row("speed-up", _speedup_line(result))
    if result.noisy:
        lines.append("  WARNING: the spread is too large to conclude a speed-up; "
                     "rerun on a quieter machine or with more repeats")
    elif result.verdict and not result.verdict.get("conclusive", True):
        lines.append(f"  (within noise: {result.verdict.get('why_not') or 'not concluded'})")
    if len(result.compared) > 1:
        row("compared", _compared_line(result))
    bound = result.estimate_s
    if _finite(bound):
        ratio = result.roofline_ratio
        tail = f"; the chosen program runs at {ratio:.2f}x the bound" if _finite(ratio) and not est else ""
        base = (f" (direct lowering's bound {fmt_time(result.baseline_estimate_s)})"
                if _finite(result.baseline_estimate_s) else "")
        row("roofline", f"bound {fmt_time(bound)}{base}{tail}")
    else:
        row("roofline", "n/a")
    row("candidates", _counts_line(result.counts))
    stages = ", ".join(f"{k} {fmt_time(v)}" for k, v in result.stages.items())
    row("search", fmt_time(result.search_s) + (f"  ({stages})" if stages else ""))
    if result.blocks:
        row("blocks", _blocks_line(result.blocks))
    flags = []
    if result.from_cache:
        flags.append("from the cache (no search was run)")
    if result.interrupted:
        flags.append("interrupted: the best found before the stop")
    if flags:
        row("state", "; ".join(flags))
    if _finite(result.rank_correlation):
        row("model rank", f"Spearman rho {result.rank_correlation:.2f} between the cost model's estimates "
                          "and measured times")
    row("seed", str(result.seed))
    if result.history:
        lines.append("  history")
        lines += _history_table(result)
    if result.notes:
        lines.append("  notes")
        lines += [f"    - {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


# --- JSON -----------------------------------------------------------------------------------------

def json_report(result: SearchResult) -> str:
    """``result.summary()`` as strict JSON (``summary`` already maps non-finite numbers to null)."""
    return json.dumps(result.summary(), indent=2, allow_nan=False)


# --- PNG ------------------------------------------------------------------------------------------

def _best_so_far(trials: list[Trial]) -> tuple[list[int], list[float]]:
    xs, ys, best = [], [], math.inf
    for i, t in enumerate(trials, 1):
        if t.status in ("timed", "estimated") and _finite(t.time_s) and t.time_s > 0:
            best = min(best, t.time_s)
        if math.isfinite(best):
            xs.append(i)
            ys.append(best)
    return xs, ys


def _title(result: SearchResult) -> str:
    x = result.speedup
    sp = f"{x:.2f}x over direct lowering" if _finite(x) else "speed-up n/a"
    tags = [t for t, on in (("estimated", result.estimated), ("noisy", result.noisy),
                            ("from cache", result.from_cache), ("interrupted", result.interrupted)) if on]
    return f"{result.device} · {result.backend} · {sp}" + (f" ({', '.join(tags)})" if tags else "")


def _time_axis(ax, span: float) -> None:
    """Log time ticks labelled with units (µs/ms/s); minor ticks labelled too when under two decades."""
    from matplotlib.ticker import FuncFormatter

    def minor(y: float, _pos: int) -> str:
        m = y / 10 ** math.floor(math.log10(y)) if y > 0 else 0
        return fmt_time(y) if span < 100 and any(abs(m - k) < 1e-6 for k in (2, 3, 5)) else ""

    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: fmt_time(y)))
    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


def png_report(result: SearchResult, path: str) -> str:
    """Best time so far against candidates evaluated, written as a PNG to `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(10, 4.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    trials = sorted(result.trials, key=lambda t: t.index)
    n = len(trials)
    blocks = sorted({t.block for t in trials})
    positive: list[float] = []

    ok = [(i, t) for i, t in enumerate(trials, 1)
          if t.status in ("timed", "estimated") and _finite(t.time_s) and t.time_s > 0]
    if ok:
        ax.scatter([i for i, _ in ok], [t.time_s for _, t in ok], s=14, alpha=0.35, color="tab:blue",
                   linewidths=0, label=f"candidates ({len(ok)})")
        positive += [t.time_s for _, t in ok]
    for b in blocks:  # one best-so-far curve per distinct block (the times of different blocks do not compare)
        idx = [(i, t) for i, t in enumerate(trials, 1) if t.block == b]
        xs, ys = _best_so_far([t for _, t in idx])
        if xs:
            name = "best so far" + (f" [{b}]" if b else "")
            ax.plot([idx[x - 1][0] for x in xs], ys, drawstyle="steps-post", linewidth=2, label=name)
    # rejected / failed at the top of the plot: they have no time
    top = ax.get_xaxis_transform()  # x in data, y in axes fraction
    for status, marker, color in (("rejected", "x", "tab:red"), ("failed", "v", "tab:orange")):
        xs = [i for i, t in enumerate(trials, 1) if t.status == status]
        if xs:
            ax.scatter(xs, [0.97] * len(xs), transform=top, marker=marker, s=18, color=color, clip_on=False,
                       label=f"{status} ({len(xs)})")
    pruned = sum(t.status == "pruned" for t in trials)
    if pruned:
        ax.plot([], [], " ", label=f"pruned, not run ({pruned})")

    whole = " (whole program)" if any(blocks) else ""
    if _finite(result.baseline_time_s) and result.baseline_time_s > 0:
        ax.axhline(result.baseline_time_s, color="black", linewidth=1.2,
                   label=f"direct lowering{whole}: {fmt_time(result.baseline_time_s)}")
        positive.append(result.baseline_time_s)
    if _finite(result.time_s) and result.time_s > 0:
        ax.axhline(result.time_s, color="tab:green", linewidth=1, linestyle=":",
                   label=f"chosen{whole}: {fmt_time(result.time_s)}")
        positive.append(result.time_s)
    if _finite(result.estimate_s) and result.estimate_s > 0:
        ax.axhline(result.estimate_s, color="tab:gray", linewidth=1.2, linestyle="--",
                   label=f"roofline bound{whole}: {fmt_time(result.estimate_s)}")
        positive.append(result.estimate_s)

    if positive:
        ax.set_yscale("log")
        lo, hi = min(positive) / 1.6, max(positive) * 1.6
        ax.set_ylim(lo, hi)
        _time_axis(ax, hi / lo)
    ax.set_xlim(0, max(n, 1) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("candidates evaluated (in order)")
    ax.set_ylabel("time" + (" (estimated by the cost model)" if result.estimated else ""))
    ax.set_title(_title(result), fontsize=11)
    if n == 0:
        why = "from the cache: no search was run" if result.from_cache else "no candidates recorded"
        ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="dimgray")
        ax.set_xticks([])
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
