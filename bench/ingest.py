"""The benchmarks' raw JSON, read into one results record: sections, verdicts against the peers, quoted ratios.

Every verdict goes through ``egraft.measure.compare`` on the raw samples
(the medians' ~95 % intervals apart and no spread above 50 %, else no
conclusion), so the page never states a ratio the measurement does not
support: an inconclusive comparison is recorded with its reason and shown
as "not concluded" instead of a ratio.  Every ratio the page or the README
quotes is registered in ``ratios`` under an id, with the row it comes from.
"""

from __future__ import annotations

import math

import envelope
from egraft.measure import compare

SEARCH_STEPS = ("search-1t", "search-2t", "search-cuda")
SEARCH_PEERS = ("eager", "torch.compile", "torch.compile max-autotune")
SEARCH_EGRAFT = "searched"
GEN_PEERS = ("hf_eager", "hf_static_inductor", "vllm")
GEN_EGRAFT = ("egraft_compile", "egraft_dynamo")
GEN_LABELS = {"hf_eager": "HF eager", "hf_static_inductor": "HF static + Inductor", "vllm": "vLLM (CPU)",
              "egraft_dynamo": "egraft via torch.compile", "egraft_compile": "egraft.compile"}


def ratio_text(x: float) -> str:
    """How a ratio is written everywhere (page, README): two decimals and an x."""
    return f"{x:.2f}x"


def _timing(t: dict | None):
    """A raw timing record ({median, spread, n, samples}) as an egraft Timing; None without samples."""
    if not t or not t.get("samples"):
        return None
    return envelope.load_timing(t)


class Ratios:
    """The registry of quoted ratios: id -> value, its text and what it compares."""

    def __init__(self):
        self.items: dict[str, dict] = {}

    def add(self, rid: str, value: float, what: str) -> str:
        text = ratio_text(value)
        self.items[rid] = {"value": value, "text": text, "what": what}
        return text


def verdict(mine, peers: dict, ratios: Ratios, rid: str, what: str, roofline_share: float | None = None) -> dict:
    """egraft's timing against the fastest peer (lowest median) through the one conclusion rule."""
    peers = {k: v for k, v in peers.items() if v is not None}
    if mine is None or not peers:
        return {"id": rid, "what": what, "conclusive": False, "text": "not measured", "why_not": "no samples"}
    best = min(peers, key=lambda k: peers[k].median)
    c = compare(mine, peers[best])
    out = {"id": rid, "what": what, "best_peer": best, "ratio": c["speedup"], "interval": c["interval"],
           "conclusive": c["conclusive"], "why_not": c["why_not"], "roofline_share": roofline_share,
           "spread": {"egraft": mine.spread, "peer": peers[best].spread}}
    if c["conclusive"]:
        r = ratios.add(rid, c["speedup"], f"{what}: egraft over {best}")
        lo, hi = (f"{v:.2f}" for v in c["interval"])
        out["text"] = (f"ahead of {best}: {r} (95 % interval {lo}-{hi})" if c["speedup"] > 1 else
                       f"behind {best}: {r} (95 % interval {lo}-{hi})")
        out["standing"] = "ahead" if c["speedup"] > 1 else "behind"
    else:
        out["text"] = f"not concluded against {best}: {c['why_not']}"
        out["standing"] = "not concluded"
    return out


# --- sections -------------------------------------------------------------------------------------------

def _header(raw: dict, step: str) -> dict:
    suite = raw.get("suite", {})
    info = raw.get("info", {})  # bench/generate.py keeps its envelope under "info"
    return {"step": step, "status": raw.get("status", "ok"), "date": raw.get("date", info.get("date")),
            "command": suite.get("command") or raw.get("command") or info.get("command"),
            "quick": raw.get("quick", (info.get("config") or {}).get("quick")),
            "threads": raw.get("threads"), "cores": raw.get("cores"), "wall_s": suite.get("wall_s")}


def search_section(raw: dict, step: str, ratios: Ratios) -> tuple[dict, list[dict]]:
    sec = _header(raw, step)
    rows, verdicts = [], []
    for w in raw.get("rows", []):
        tims = {k: _timing(v) for k, v in (w.get("timings") or {}).items()}
        eager = tims.get("eager")
        over_eager = {}
        for k, t in tims.items():
            if t is None or eager is None:
                continue
            c = compare(t, eager)
            over_eager[k] = {"ratio": c["speedup"], "interval": c["interval"], "conclusive": c["conclusive"],
                             "why_not": c["why_not"], "median_s": t.median, "spread": t.spread}
            if c["conclusive"] and k != "eager":
                ratios.add(f"{step}/{w['workload']}/{k}/over-eager", c["speedup"],
                           f"{step} {w['workload']}: {k} over eager")
        mine = tims.get(SEARCH_EGRAFT)
        bound = w.get("roofline_bound_s")
        share = bound / mine.median if bound and mine is not None and mine.median > 0 else None
        v = verdict(mine, {k: tims.get(k) for k in SEARCH_PEERS}, ratios, f"{step}/{w['workload']}",
                    f"{w['workload']} ({step})", share)
        v.update(section=step, workload=f"{w['workload']}, {raw['threads']} thread(s)" if raw.get("threads")
                 else w["workload"])  # a search step per thread count: the label says which
        verdicts.append(v)
        rows.append({"workload": w["workload"], "backend": w.get("backend"), "knobs": w.get("knobs"),
                     "over_eager": over_eager, "eager_ms": eager.median * 1e3 if eager else None,
                     "roofline_bound_s": bound, "roofline_share": share,
                     "trials": w["trials"] if isinstance(w.get("trials"), list) else [],
                     "search_s": w.get("search_s"), "trace_s": w.get("trace_s"), "saturate_s": w.get("saturate_s"),
                     "counts": w.get("counts"), "rank_correlation": w.get("rank_correlation"),
                     "ga_over_random": (w["random_best_s"] / w["ga_best_s"]
                                        if w.get("random_best_s") and w.get("ga_best_s") else None)})
    sec["rows"] = rows
    if raw.get("gpt2_12_layers"):
        sec["gpt2_12_layers"] = raw["gpt2_12_layers"]
    return sec, verdicts


def generation_section(raw: dict, ratios: Ratios) -> tuple[dict, list[dict]]:
    sec = _header(raw, "generate")
    info = raw.get("info", {})
    sec["config"] = info.get("config", {})
    sec["bandwidth"] = {t: {"median": b["bytes_per_s"]["median"], "spread": b["bytes_per_s"]["spread"],
                            "cores": b.get("cores")} for t, b in raw.get("bandwidth", {}).items()}
    sec["models"] = raw.get("models", {})
    rows, systems, verdicts = [], [], []
    for r in raw.get("runs", []):
        sysrow = {"system": r["system"], "label": GEN_LABELS.get(r["system"], r["system"]), "model": r["model"],
                  "threads": r["threads"], "status": r["status"]}
        if r["status"] == "ok":
            sysrow.update(first_call_s=r.get("first_call_s"), extra_bucket_s=r.get("extra_bucket_s"),
                          peak_rss_mib=r["peak_rss_bytes"] / 2 ** 20, tokens_match=r.get("tokens_match_reference"),
                          fallbacks=sum(w["count"] for w in r.get("warnings", [])
                                        if w["category"] == "EgraftFallbackWarning"))
            for c in r["configs"]:
                rows.append({"system": r["system"], "model": r["model"], "threads": r["threads"],
                             "batch": c["batch"], "prompt": c["prompt"], "new_tokens": c["new_tokens"],
                             "prefill": c.get("prefill"), "decode_step": c.get("decode_step"),
                             "decode_tokens_per_s": c.get("decode_tokens_per_s"),
                             "bound_tokens_per_s": (c.get("bound") or {}).get("tokens_per_s"),
                             "bound_fraction": (c.get("bound") or {}).get("fraction"),
                             "tokens_match": (c.get("check") or {}).get("match")})
        systems.append(sysrow)
    sec["rows"], sec["systems"] = rows, systems
    keys = sorted({(x["model"], x["threads"], x["batch"], x["prompt"]) for x in rows})
    for model, threads, batch, prompt in keys:
        at = {x["system"]: x for x in rows if (x["model"], x["threads"], x["batch"], x["prompt"]) ==
              (model, threads, batch, prompt)}
        for mine in GEN_EGRAFT:
            if mine not in at:
                continue
            me = at[mine]
            where = f"{model}, {threads} thread(s), batch {batch}, prompt {prompt}"
            rid = f"generate/{model}/{threads}t/b{batch}/p{prompt}/{mine}"
            if me["tokens_match"] is False:
                verdicts.append({"id": rid, "section": "generate", "workload": where, "egraft": mine,
                                 "conclusive": False, "standing": "wrong tokens", "what": where,
                                 "text": "tokens differ from HF eager: not compared"})
                continue
            peers = {p: _timing(at[p]["decode_step"]) for p in GEN_PEERS if p in at}
            v = verdict(_timing(me["decode_step"]), peers, ratios, rid + "/decode",
                        f"decode, {where} ({GEN_LABELS[mine]})", me["bound_fraction"])
            v.update(section="generate", workload=where, egraft=mine, metric="decode")
            verdicts.append(v)
            peers = {p: _timing(at[p]["prefill"]) for p in GEN_PEERS if p in at}
            v = verdict(_timing(me["prefill"]), peers, ratios, rid + "/prefill",
                        f"prefill, {where} ({GEN_LABELS[mine]})")
            v.update(section="generate", workload=where, egraft=mine, metric="prefill")
            verdicts.append(v)
    return sec, verdicts


SIZE_STEPS = ("peers", "real_size")  # raw files named <step>[_<what>].json: bench/peers.py, bench/real_size.py


def is_size_step(step: str) -> bool:
    return any(step == s or step.startswith(s + "_") for s in SIZE_STEPS)


def precision(row: dict) -> str:
    """How a deployed-size row's weights are held: its dtype, or its quantisation (and group size)."""
    q = row.get("quantize")
    if q in (None, "none"):
        return row["dtype"]
    return f"{q}, groups of {row['group_size']}" if row.get("group_size") and q.endswith("int4") else q


def _vs(vs: dict | None, ratios: Ratios, rid: str, what: str) -> dict | None:
    """A raw ``egraft_vs`` record ({speedup, interval, conclusive, why_not}) with its text; registered when
    concluded."""
    if not vs or not finite(vs.get("speedup")):
        return None
    out = dict(vs)
    out["text"] = (ratios.add(rid, vs["speedup"], what) if vs.get("conclusive") else
                   "n.c.")
    return out


def sizes_section(raw: dict, step: str, ratios: Ratios) -> dict:
    """A real-size run (bench/real_size.py: compile, save, load, decode against HF eager) or a peers run
    (bench/peers.py: the same, then llama.cpp at the same precision, one core and both): one row per model
    and precision, each ratio the run concluded registered."""
    sec = _header(raw, step)
    sec["host"], sec["rows"] = raw.get("host", {}), []
    for r in raw.get("rows", []):
        prec = precision(r)
        base = f"{step}/{r['model']}/{prec}"
        load = _keep(r.get("load"), ("load_s", "reload_s", "cold_load_s", "decode_tok_s", "decode_spread", "prefill_ms"))
        for peer in ("hf_eager", "hf_static_inductor"):
            load[f"vs_{peer}"] = _vs((r.get("load") or {}).get(f"egraft_vs_{peer}"), ratios, f"{base}/{peer}",
                                     f"decode, {r['model']} {prec}, one core: egraft over {GEN_LABELS[peer]}")
        runs = {"runs": [], "vllm_runs": []}  # llama.cpp's measuring processes; vLLM's (peers.py --vllm)
        for key, into in runs.items():
            for run in (run for run in r.get(key, []) if "error" not in run):  # (a failed child: in the raw file)
                t, where = run["threads"], "" if key == "runs" else "vllm-process/"
                vs = {peer: _vs(v, ratios, f"{base}/{t}t/{where}{peer}", f"decode, {r['model']} {prec}, {t} "
                                f"thread(s): egraft over {peer}") for peer, v in (run.get("egraft_vs") or {}).items()}
                into.append({**_keep(run, ("threads", "decode_tok_s", "decode_spread", "prefill_ms", "decode_bound",
                                           "tokens_equal_transformers", "llama_cpp_extra_bufts")), "vs": vs})
        compiled = _keep(r.get("compile"), ("compile_s", "stages_s", "peak_rss", "peak_over_weights", "weights_bytes",
                                             "artifact_over_weights", "tokens_equal", "tokens_equal_each_row_alone"))
        sec["rows"].append({"model": r["model"], "dtype": r["dtype"], "precision": prec, "budget": r.get("budget"),
                            "threads": r.get("threads"), "compile": compiled, "load": load, **runs})
    return sec


def modes_section(raw: dict, step: str, ratios: Ratios) -> dict:
    """A run of egraft's quantisation modes side by side (bench/quant_modes.py): each mode's compile and
    tokens, one process's interleaved decode of all, each concluded pair's ratio registered."""
    sec = _header(raw, step)
    sec["host"], sec["model"], sec["budget"] = raw.get("host", {}), raw.get("model"), raw.get("budget")
    sec["compile"] = raw.get("compile", {})
    timing = raw.get("timing") or {}
    sec["timing"] = _keep(timing, ("decode_tok_s", "decode_spread", "prefill_ms"))
    sec["vs"] = {pair: _vs(v, ratios, f"{step}/{pair}", f"decode, {raw.get('model')}, one core, one process: "
                           + pair.replace("_over_", " over "))
                 for pair, v in (timing.get("vs") or {}).items()}
    return sec


def gpu_section(raw: dict, step: str, ratios: Ratios) -> dict:
    """A lent GPU's raw record (``gpu_*.json``): its keys, each generation run's ratio over HF eager registered."""
    sec = plain_section(raw, step)
    for key, rec in list(sec.items()):
        if isinstance(rec, dict) and "decode_tok_s" in rec:
            sec[key] = {**rec, "vs_hf_eager": _vs(rec.get("egraft_vs_hf_eager"), ratios, f"{step}/{key}/hf_eager",
                                                  f"decode, {rec.get('model')} {rec.get('dtype')} on "
                                                  f"{raw.get('gpu', 'a GPU')}: egraft over HF eager")}
    return sec


def _keep(d: dict | None, keys: tuple[str, ...]) -> dict:
    return {k: d[k] for k in keys if k in d} if d else {}


def plain_section(raw: dict, step: str) -> dict:
    """Tracing, saturation, compile depth, call overhead: their raw keys, under the common header."""
    sec = _header(raw, step)
    skip = {"bench", "date", "command", "quick", "threads", "cores", "suite", "status"}
    sec.update({k: v for k, v in raw.items() if k not in skip})
    return sec


def machine_record(m: dict) -> dict:
    per = {}
    for t, x in (m.get("per_threads") or {}).items():
        bw = x["read_bandwidth"]
        per[t] = {"cores": x["cores"], "read_bandwidth": {"median": bw["median"], "spread": bw["spread"]},
                  "peak_flops_float32": x["peak_flops_float32"]}
    return {**m.get("host", {}), "per_threads": per, "gpu": m.get("gpu")}


def build(raw: dict[str, dict]) -> dict:
    """The results record of every raw result present (the machine's description must be among them)."""
    m = raw["machine"]
    ratios = Ratios()
    sections, verdicts = {}, []
    for step, r in raw.items():
        if step == "machine":
            continue
        if r.get("status", "ok") != "ok":
            sections[step] = _header(r, step)
            continue
        if step in SEARCH_STEPS:
            sections[step], vs = search_section(r, step, ratios)
        elif step == "generate":
            sections[step], vs = generation_section(r, ratios)
        elif is_size_step(step):
            sections[step], vs = sizes_section(r, step, ratios), []
        elif step.startswith("gpu_"):
            sections[step], vs = gpu_section(r, step, ratios), []
        elif step.startswith("quant_modes"):
            sections[step], vs = modes_section(r, step, ratios), []
        else:
            sections[step], vs = plain_section(r, step), []
        verdicts += vs
    return {"date": m.get("date"), "command": m.get("command"), "mode": m.get("mode"), "device": m.get("device"),
            "machine": machine_record(m), "versions": m.get("versions", {}), "sections": sections,
            "verdicts": verdicts, "ratios": ratios.items}


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
