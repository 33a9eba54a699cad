"""A compiled model's report: a JSON record per signature, and the text a person reads.

Per signature: what was traced (nodes, ops, weights), how far the e-graph
grew, what the search looked at (candidates timed, rejected, answered from
its memo; whether the result came from the cache), what it chose (backend,
knobs, roofline ratio, whether its own comparison was noisy), the seconds of
each stage, the check against eager PyTorch, and the speed-up over eager
PyTorch and torch.compile with their spreads as ``CompiledModel.measure``
last measured it (:func:`egraft.measure.compare_model`), or that the
machine was too noisy to conclude one.  Rendering runs nothing.
"""

from __future__ import annotations

import math

from ..search.report import fmt_spread, fmt_time
from ..search.result import jsonable
from ..search.statuses import COUNT_KEYS

STAGES = ("trace", "saturate", "search", "lower", "validate")


def json_report(cm, progs) -> dict:
    """The strict-JSON record of `progs` (Programs of `cm`)."""
    o = cm.config
    return jsonable({
        "model": type(cm.model).__name__, "device": o.device, "backend": o.backend,
        "signatures": [_signature(p) for p in progs],
    })


def _signature(p) -> dict:
    r = p.result
    s = r.summary()
    return {
        "signature": p.name,
        "inputs": p.traced["inputs"],
        "traced": {k: p.traced[k] for k in ("nodes", "ops", "weights", "weight_bytes")},
        "saturated": dict(r.saturation),
        "searched": {"fitness": r.fitness, "from_cache": r.from_cache, "interrupted": r.interrupted,
                     "counts": s["counts"], "trials": len(r.trials), "blocks": s["blocks"],
                     "stages": s["stages"], "notes": s["notes"]},
        "chosen": {"backend": r.backend, "knobs": s["knobs"], "nodes": len(r.graph.nodes),
                   "time_s": s["time_s"], "spread": s["spread"], "estimated": r.estimated,
                   "estimate_s": s["estimate_s"], "roofline_ratio": s["roofline_ratio"],
                   "speedup_over_direct": s["speedup"], "noisy": r.noisy,
                   "direct_time_s": s["baseline_time_s"], "direct_spread": s["baseline_spread"]},
        "stages": {k: p.stages.get(k, 0.0) for k in STAGES},
        "validation": p.validation,
        "comparison": p.comparison,
    }


def text_report(doc: dict) -> str:
    """The JSON record as lines a person reads."""
    n = len(doc["signatures"])
    lines = [f"egraft: {doc['model']} compiled for {doc['device']} (backend {doc['backend']}), "
             f"{n} signature{'s' if n != 1 else ''}"]
    for sig in doc["signatures"]:
        lines += [""] + _signature_lines(sig)
    return "\n".join(lines)


def _signature_lines(s: dict) -> list[str]:
    t, sat, se, ch = s["traced"], s["saturated"], s["searched"], s["chosen"]
    ops = sorted(t["ops"].items(), key=lambda kv: -kv[1])
    top = ", ".join(f"{k} {v}" for k, v in ops[:6]) + (", ..." if len(ops) > 6 else "")
    out = [f"signature {s['signature']}  (" + ", ".join(f"{i['name']}" for i in s["inputs"]) + ")",
           f"  traced     {t['nodes']} nodes ({top}); {t['weights']} weights, {_bytes(t['weight_bytes'])}"]
    size = f"{sat['classes']} e-classes, {sat['nodes']} e-nodes" if "classes" in sat else "size not recorded"
    stop = f" ({sat['stop_reason']})" if sat.get("stop_reason") else ""
    if se["from_cache"]:
        out.append(f"  saturated  {size}{stop}, when the cached search ran; not run again")
    else:
        out.append(f"  saturated  {size}{stop} in {_secs(s['stages']['saturate'])}")
    counts = ", ".join(f"{se['counts'][k]} {k}" for k in COUNT_KEYS if se["counts"].get(k))
    out.append(f"  searched   {counts or 'no candidates'} ({se['fitness']} fitness"
               + (", from the cache" if se["from_cache"] else "") + (", interrupted" if se["interrupted"] else "")
               + ")")
    knobs = ", ".join(f"{k}={v}" for k, v in ch["knobs"].items())
    est = "estimated " if ch["estimated"] else ""
    # measured over the cost model's bound: below 1 the model's peaks for this device are too low
    roof = "" if ch["estimated"] else f", {_x(ch['roofline_ratio'])} the roofline estimate"
    out.append(f"  chosen     {ch['backend']} ({knobs}); {ch['nodes']} nodes; {est}{fmt_time(ch['time_s'])}"
               + ("" if ch["estimated"] else f" {fmt_spread(ch['spread'])}")
               + f"{roof}, {_x(ch['speedup_over_direct'])} faster than the direct lowering"
               + ("" if ch["estimated"] or ch.get("direct_time_s") is None
                  else f" ({fmt_time(ch['direct_time_s'])} {fmt_spread(ch.get('direct_spread') or 0.0)})")
               + (" (noisy: the search's own comparison could not conclude)" if ch["noisy"] else ""))
    out.append("  stages     " + ", ".join(f"{k} {_secs(s['stages'][k])}" for k in STAGES))
    v = s["validation"]
    out.append("  checked    not checked against eager PyTorch (compiled with validate=False)" if v is None else
               f"  checked    against eager PyTorch on {v['sets']} input sets: max relative error "
               f"{v['max_error']:.2g} (allowed {max(v['tolerances'], default=0):.2g})")
    out += _comparison_lines(s["comparison"])
    return out


def _comparison_lines(c: dict | None) -> list[str]:
    if c is None:
        return ["  measured   not measured (CompiledModel.measure() times it against eager PyTorch and torch.compile)"]
    cond = c["conditions"]
    where = (f"pinned to core {','.join(map(str, cond['pinned']))}, {cond['torch_threads']} torch thread"
             if cond["pinned"] else f"{cond['device']}, {cond['torch_threads']} torch threads")
    times = ", ".join(f"{k} {fmt_time(v['median_s'])} {fmt_spread(v['spread'])}" for k, v in c["times"].items())
    out = [f"  measured   {times}  (medians of {cond['rounds']} interleaved rounds x {cond['repeats']} calls, "
           f"{where})"]
    for name, v in c["speedups"].items():
        lo, hi = v.get("interval") or (math.nan, math.nan)
        ci = f"95 % interval {lo:.2f}-{hi:.2f}x"
        if v["conclusive"]:
            word = "faster" if v["speedup"] >= 1 else "SLOWER"
            out.append(f"  vs {name:13s} {v['speedup']:.2f}x ({word}; {ci})")
        else:
            out.append(f"  vs {name:13s} {_x(v['speedup'])} ({ci}), but the machine was too noisy to conclude "
                       f"({v['why_not']}); measure again on a quiet machine")
    if c.get("torch_compile_s") is not None:
        out.append(f"  (torch.compile took {_secs(c['torch_compile_s'])} to compile, not counted)")
    out += [f"  note: {n}" for n in c.get("notes", [])]
    return out


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover - the loop returns


def _secs(x) -> str:
    return f"{x:.2f} s" if isinstance(x, (int, float)) else "n/a"


def _x(x) -> str:
    return f"{x:.2f}x" if isinstance(x, (int, float)) else "n/a"
