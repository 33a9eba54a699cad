"""The results page's plots (matplotlib, PNG), drawn from the results record of bench/ingest.py.

* ``headline.png``: egraft against the fastest peer per workload (the
  searched program per search workload, decode of ``egraft.compile`` per
  generation configuration), the ratio with its ~95 % interval; green
  ahead, red behind, grey where the rule concludes nothing;
* ``speedup.png``: every system's speed-up over eager per workload, with
  intervals, one panel per thread count;
* ``decode.png``: decode tokens/s per system and configuration with the
  bandwidth bound drawn, one panel per model and thread count;
* ``compile_depth.png``: compile time split by phase against depth, with
  the fitted growth of the total;
* ``search.png``: the search's candidates and best time so far against
  candidates timed, with the cost model's roofline bound.

Each function returns the file it wrote, or None when its data is absent.
"""

from __future__ import annotations

import math
import os

COLORS = {"ahead": "tab:green", "behind": "tab:red", "not concluded": "tab:gray", "wrong tokens": "black"}


def _figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path)
    return path


def _err(ratio: float, interval) -> list[float]:
    lo, hi = interval
    return [max(ratio - lo, 0.0) if math.isfinite(lo) else 0.0, max(hi - ratio, 0.0) if math.isfinite(hi) else 0.0]


def headline(res: dict, path: str) -> str | None:
    vs = [v for v in res["verdicts"] if "ratio" in v and (v.get("section", "").startswith("search")
          or (v.get("metric") == "decode" and v.get("egraft") == "egraft_compile"))]
    if not vs:
        return None
    fig = _figure(9, 1.2 + 0.28 * len(vs))
    ax = fig.add_subplot(1, 1, 1)
    ys = list(range(len(vs)))[::-1]
    for y, v in zip(ys, vs):
        e = _err(v["ratio"], v["interval"])
        ax.barh(y, v["ratio"] - 1, left=1, color=COLORS[v["standing"]], alpha=0.8)
        ax.errorbar(v["ratio"], y, xerr=[[e[0]], [e[1]]], color="black", capsize=2, linewidth=0.8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{v['workload']} vs {v['best_peer']}" for v in vs], fontsize=7)
    ax.set_xlabel("egraft's speed-up over the fastest peer (>1: egraft faster); bars: ~95 % interval")
    ax.set_title("egraft against the best peer (green ahead, red behind, grey: not concluded)", fontsize=9)
    return _save(fig, path)


def speedup(res: dict, path: str) -> str | None:
    secs = [(k, s) for k, s in res["sections"].items()
            if k.startswith("search") and any(r["over_eager"] for r in s.get("rows", []))]
    if not secs:
        return None
    fig = _figure(11, 3.6 * len(secs))
    for i, (step, sec) in enumerate(secs, 1):
        ax = fig.add_subplot(len(secs), 1, i)
        variants = [v for v in ("torch.compile", "torch.compile max-autotune", "direct", "greedy", "searched")
                    if any(v in r["over_eager"] for r in sec["rows"])]
        width = 0.8 / max(len(variants), 1)
        for j, var in enumerate(variants):
            xs, ys, errs = [], [], [[], []]
            for k, r in enumerate(sec["rows"]):
                o = r["over_eager"].get(var)
                if o is None:
                    continue
                e = _err(o["ratio"], o["interval"])
                xs.append(k + (j - (len(variants) - 1) / 2) * width)
                ys.append(o["ratio"])
                errs[0].append(e[0])
                errs[1].append(e[1])
            ax.bar(xs, ys, width=width, label=var, yerr=errs, capsize=2, error_kw={"linewidth": 0.7})
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(sec["rows"])))
        ax.set_xticklabels([r["workload"] for r in sec["rows"]], fontsize=8)
        ax.set_ylabel("speed-up over eager")
        ax.set_title(f"{step}: speed-up over torch eager (bars: ~95 % interval of the ratio)", fontsize=9)
        ax.legend(fontsize=7, ncol=len(variants))
    return _save(fig, path)


def decode(res: dict, path: str) -> str | None:
    sec = res["sections"].get("generate")
    if not sec or not sec.get("rows"):
        return None
    panels = sorted({(r["model"], r["threads"]) for r in sec["rows"]})
    fig = _figure(11, 3.4 * len(panels))
    order = ["hf_eager", "hf_static_inductor", "vllm", "egraft_dynamo", "egraft_compile"]
    from ingest import GEN_LABELS

    for i, (model, threads) in enumerate(panels, 1):
        ax = fig.add_subplot(len(panels), 1, i)
        rows = [r for r in sec["rows"] if (r["model"], r["threads"]) == (model, threads)]
        configs = sorted({(r["batch"], r["prompt"]) for r in rows})
        systems = [s for s in order if any(r["system"] == s for r in rows)]
        width = 0.8 / max(len(systems), 1)
        for j, s in enumerate(systems):
            xs, ys, errs = [], [], []
            for k, cfg in enumerate(configs):
                r = next((r for r in rows if r["system"] == s and (r["batch"], r["prompt"]) == cfg), None)
                d = r and r["decode_tokens_per_s"]
                if not d:
                    continue
                xs.append(k + (j - (len(systems) - 1) / 2) * width)
                ys.append(d["median"])
                errs.append(d["spread"] * d["median"] / 2)
            ax.bar(xs, ys, width=width, yerr=errs, capsize=2, label=GEN_LABELS.get(s, s), error_kw={"linewidth": 0.7})
        for k, cfg in enumerate(configs):
            b = next((r["bound_tokens_per_s"] for r in rows if (r["batch"], r["prompt"]) == cfg
                      and r["bound_tokens_per_s"]), None)
            if b:
                ax.plot([k - 0.45, k + 0.45], [b, b], color="black", linestyle="--", linewidth=1,
                        label="bandwidth bound" if k == 0 else None)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend above the bars and the bound
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels([f"batch {b}, prompt {p}" for b, p in configs], fontsize=8)
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"{model}, {threads} thread(s): decode tokens/s (bars: p10-p90 or IQR spread; dashes: the "
                     "bound from the bytes read per step over the measured read bandwidth)", fontsize=8)
        ax.legend(fontsize=7, ncol=3)
    return _save(fig, path)


def compile_depth(res: dict, path: str) -> str | None:
    sec = res["sections"].get("compile_depth")
    if not sec or not sec.get("rows"):
        return None
    rows = sorted(sec["rows"], key=lambda r: r["layers"])
    layers = [r["layers"] for r in rows]
    phases = [p for p in rows[0]["phases"] if any(r["phases"].get(p) for r in rows)]
    fig = _figure(9, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    bottom = [0.0] * len(rows)
    xs = list(range(len(rows)))
    for p in phases:
        ys = [r["phases"].get(p, 0.0) for r in rows]
        ax.bar(xs, ys, bottom=bottom, label=p, width=0.6)
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax.plot(xs, [r["total_s"] for r in rows], "ko", label="total")
    fit = (sec.get("fits") or {}).get("total", {}).get("power")
    if fit and fit.get("k") is not None:
        ax.plot(xs, [fit["c"] * L ** fit["k"] for L in layers], "k--", linewidth=1,
                label=f"fit: total = {fit['c']:.3g} s x L^{fit['k']:.2f} (R² {fit['r2']:.2f})")
    ax.set_xticks(xs)
    ax.set_xticklabels([str(L) for L in layers])
    ax.set_xlabel("layers")
    ax.set_ylabel("seconds")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)
    ax.set_title("egraft.compile's time by phase against depth (search: candidates lowered, validated and timed)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    return _save(fig, path)


def search(res: dict, path: str) -> str | None:
    step = next((k for k in ("search-1t", "search-cuda", "search-2t") if res["sections"].get(k, {}).get("rows")), None)
    if step is None:
        return None
    rows = [r for r in res["sections"][step]["rows"] if r.get("trials")]
    if not rows:
        return None
    cols = min(4, len(rows))
    nrows = -(-len(rows) // cols)
    fig = _figure(3.2 * cols, 2.8 * nrows)
    for i, r in enumerate(rows, 1):
        ax = fig.add_subplot(nrows, cols, i)
        ok = [(t[0], t[1]) for t in r["trials"] if t[1] is not None and t[1] > 0]
        if ok:
            ax.scatter([x for x, _ in ok], [y * 1e3 for _, y in ok], s=8, alpha=0.4, label="candidates")
            best, xs, ys = math.inf, [], []
            for x, y in ok:
                best = min(best, y)
                xs.append(x)
                ys.append(best * 1e3)
            ax.step(xs, ys, where="post", color="tab:orange", label="best so far")
        if r.get("roofline_bound_s"):
            ax.axhline(r["roofline_bound_s"] * 1e3, color="black", linestyle="--", linewidth=1, label="roofline")
        ax.set_title(r["workload"], fontsize=8)
        ax.set_xlabel("candidates timed", fontsize=7)
        ax.set_ylabel("ms per call", fontsize=7)
        ax.tick_params(labelsize=7)
        if i == 1:
            ax.legend(fontsize=6)
    fig.suptitle(f"{step}: the search's best time against candidates timed, with the cost model's bound", fontsize=9)
    return _save(fig, path)


ALL = {"headline.png": headline, "speedup.png": speedup, "decode.png": decode,
       "compile_depth.png": compile_depth, "search.png": search}


def draw_all(res: dict, out_dir: str) -> dict[str, str]:
    """Every plot whose data is present, written under `out_dir`: {file name: path}."""
    os.makedirs(out_dir, exist_ok=True)
    done = {}
    for name, fn in ALL.items():
        p = fn(res, os.path.join(out_dir, name))
        if p:
            done[name] = p
        elif os.path.exists(os.path.join(out_dir, name)):
            os.unlink(os.path.join(out_dir, name))  # a stale plot would show data the page no longer has
    return done
