"""The results page's deployed-size sections and the README's table of them.

Built from the raw files of ``bench/real_size.py`` (``real_size*.json``:
compile, save, load and decode against HF eager at the shapes of deployed
models, random weights) and ``bench/peers.py`` (``peers*.json``: the same,
then llama.cpp at the same precision on one core and both), and from the
raw record of a lent GPU (``gpu_*.json``).  Every number the README's
table quotes is on the page, from the same rows; every ratio is registered
(``bench/ingest.py``) or written as "not concluded".
"""

from __future__ import annotations

import ingest

# the peers runs the README's table quotes, in its row order (each a raw file under docs/results/raw/)
HEADLINE = ("peers_bound", "peers_int8", "peers_int4")
GPU_HEADLINE = ("gpu_h200", "generation_0.5b_bf16_gpu_step")  # the GPU run the README quotes: raw file, key
UNQUANTISED = ("float32", "bfloat16", "float16")
SHORT = {"llama-135m": "135 M", "qwen2-0.5b": "494 M", "llama-1.2b": "1.2 B"}


def table(head: list[str], rows: list[list]) -> list[str]:
    """A markdown table (and the blank line after it): the page's and the README's one writer."""
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""]


def _num(x, digits: int = 1) -> str:
    return f"{x:.{digits}f}" if ingest.finite(x) else "-"


def _pair(d: dict | None, a: str = "egraft", b: str = "hf_eager", digits: int = 1) -> str:
    d = d or {}
    return f"{_num(d.get(a), digits)} / {_num(d.get(b), digits)}"


def _llama(run: dict) -> list[str]:
    """The llama.cpp systems of a peers run, the same precision's first (F32, F16, Q8_0, Q4_0 before BF16)."""
    names = [k for k in run["decode_tok_s"] if k.startswith("llama.cpp")]
    return sorted(names, key=lambda k: k.endswith("BF16"))


def _peers(run: dict) -> list[str]:
    """A peers run's peer systems: vLLM in a ``--vllm`` run's own processes, llama.cpp's otherwise."""
    return ["vllm"] if "vllm" in run["decode_tok_s"] else _llama(run)


def _short(name: str) -> str:
    return "vLLM" if name == "vllm" else name.removeprefix("llama.cpp ")


def compile_rows(step: str, sec: dict) -> list[list]:
    rows = []
    for r in sec["rows"]:
        c, ld = r["compile"], r["load"]
        peak = (f"{c['peak_rss'] / 1e9:.2f} ({c['peak_over_weights']:.1f} × weights)"
                if ingest.finite(c.get("peak_rss")) and ingest.finite(c.get("peak_over_weights")) else "-")
        again = [f"{_num(ld['reload_s'])} again"] if ingest.finite(ld.get("reload_s")) else []
        cold = [f"{_num(ld['cold_load_s'])} cold"] if ingest.finite(ld.get("cold_load_s")) else []
        load = _num(ld.get("load_s")) + (f" ({', '.join(again + cold)})" if again + cold else "")
        vs = (ld.get("vs_hf_eager") or {}).get("text", "-")
        if ingest.finite((ld.get("decode_tok_s") or {}).get("hf_static_inductor")):  # run with --inductor
            vs += (f"; Inductor {_num(ld['decode_tok_s']['hf_static_inductor'])} tok/s, "
                   f"{(ld.get('vs_hf_static_inductor') or {}).get('text', '-')}")
        rows.append([step, r["model"], r["precision"], _num(c.get("compile_s"), 0), peak,
                     _num(c.get("artifact_over_weights"), 3), load, _pair(ld.get("decode_tok_s")), vs,
                     _pair(ld.get("prefill_ms"), digits=0),
                     _tokens(c)])
    return rows


def _tokens(c: dict) -> str:
    """Whether egraft's tokens equal transformers' (a batch whose transformers' run differs from each row run
    alone, a half-type rounding: equal to the rows alone, said so)."""
    if c.get("tokens_equal") is False and c.get("tokens_equal_each_row_alone"):
        return "equal each row alone (transformers' batch differs)"
    return {True: "equal", False: "**differ**"}.get(c.get("tokens_equal"), "-")


def peer_rows(step: str, sec: dict) -> list[list]:
    rows = []
    for r in sec["rows"]:
        for run in r.get("runs", []) + r.get("vllm_runs", []):
            dec, share = run["decode_tok_s"], (run.get("decode_bound") or {}).get("share") or {}
            llama = _peers(run)
            bound = run.get("decode_bound") or {}
            rows.append([step, r["model"], r["precision"], run["threads"], _num(dec.get("egraft")),
                         (", ".join(f"{_short(k)} {_num(dec[k])}" for k in llama) or "-")
                         + (" (its extra buffer types off: they crashed)" if run.get("llama_cpp_extra_bufts") is False
                            else ""),
                         _num(dec.get("hf_eager")),
                         "; ".join(f"{_short(k)}: {run['vs'][k]['text']}" for k in llama
                                   if run["vs"].get(k)) or "-",
                         (f"{_num(bound.get('tok_s'), 0)} ({share['egraft']:.0%} / "
                          f"{share.get(llama[0], float('nan')):.0%})" if bound.get("tok_s") and llama
                          and ingest.finite(share.get("egraft")) else "-"),
                         _pair(run.get("prefill_ms"), b=llama[0] if llama else "hf_eager", digits=0)])
    return rows


def sizes_lines(secs: dict) -> list[str]:
    steps = sorted(s for s in secs if ingest.is_size_step(s) and secs[s].get("status", "ok") == "ok")
    if not steps:
        return []
    lines = ["## Deployed sizes: compile, load and decode", "",
             "Random weights at the published shapes of deployed models (nothing downloaded): "
             "`bench/real_size.py` compiles with `egraft.compile(model, max_batch=1, max_length=256)` (budget "
             "60 s unless the command says otherwise), saves, loads in a fresh process and decodes 64 greedy "
             "tokens against HF eager; `bench/peers.py` then times llama.cpp on the same weights at the same "
             "precision, one pinned core and both, interleaved rounds, medians. Each run below with its date "
             "and command:", ""]
    for s in steps:
        sec = secs[s]
        host = sec.get("host") or {}
        lines.append(f"- `{s}` ({sec.get('date')}, {host.get('cpu', '?')} ({host.get('cpu_id', '')})): "
                     f"`{sec.get('command')}`")
    lines += ["", "Later runs superseded earlier ones as the work went on (the list is in file-name order; the "
              "README quotes " + ", ".join(f"`{h}`" for h in HEADLINE) + ").",
              "", "Compile (seconds, peak RSS in GB), the artifact's size over the weights', a fresh "
              "process's load (seconds; again: a second fresh process, which imports torch inside the timed load; cold: "
              "one with an empty cache directory), and one pinned core's decode tokens/s and prefill ms of the loaded "
              "artifact against HF eager (a run with `--inductor` also times HF with a static cache under "
              "torch.compile's Inductor: its tokens/s and egraft over it follow the ratio; `torchao-*` rows run "
              "torchao's layers in HF; `gptq-*` / `awq-*` rows run the checkpoint's dequantised float model in HF):",
              ""]
    lines += table(["run", "model", "precision", "compile s", "peak RSS GB", "artifact / weights", "load s",
                     "decode egraft / HF eager", "egraft over HF eager", "prefill ms egraft / HF eager",
                     "tokens"], [row for s in steps for row in compile_rows(s, secs[s])])
    peers = [row for s in steps for row in peer_rows(s, secs[s])]
    if peers:
        lines += ["Against llama.cpp, and vLLM's CPU build in a `--vllm` run's own processes (decode tokens/s; the "
                  "bound is the bytes one step reads over the read bandwidth measured in the same process, with "
                  "egraft's and the peer's share of it, a share above 100 % saying that process read the bandwidth "
                  "low; prefill ms of egraft / the peer; `n.c.`: not concluded, the 95 % intervals of the medians "
                  "overlap or a spread is above 50 %):", ""]
        lines += table(["run", "model", "precision", "threads", "egraft", "peer", "HF eager",
                         "egraft over the peer", "bound tok/s (shares)", "prefill ms"], peers)
    return lines


def modes_lines(secs: dict) -> list[str]:
    """egraft's quantisation modes side by side (bench/quant_modes.py): one table per run."""
    lines = []
    for step in sorted(s for s in secs if s.startswith("quant_modes") and secs[s].get("status", "ok") == "ok"):
        sec = secs[step]
        host, t = sec.get("host") or {}, sec.get("timing") or {}
        lines += [f"## Quantisation modes side by side ({step})", "",
                  f"{sec.get('date')}, {host.get('cpu', '?')} ({host.get('cpu_id', '')}): `{sec.get('command')}`. "
                  f"Each mode compiled in its own process (budget {sec.get('budget', '60s')}; two at a time, one "
                  "core each), then one process "
                  "pinned to one core loads every artifact and times decode interleaved (medians, spreads); "
                  "the ratios compare modes in that one process (`n.c.`: not concluded).", ""]
        rows = []
        for mode, c in (sec.get("compile") or {}).items():
            q = (c.get("quantization") or {}).get("quality") or {}
            quality = (f"logit error {q['logit_rel_err']:.3f} (weight-only {q['weight_only']['logit_rel_err']:.3f}), "
                       f"top-1 {q['top1_agreement']:.1%}" if q else "-")
            over = "; ".join(f"over {pair.split('_over_')[1]}: {v['text']}" for pair, v in (sec.get("vs") or {}).items()
                             if v and pair.startswith(f"{mode}_over_"))
            rows.append([sec.get("model"), mode, _num(c.get("compile_s"), 0),
                         {True: "equal", False: "**differ**"}.get(c.get("tokens_equal_quantised_model"), "-"),
                         _num((t.get("decode_tok_s") or {}).get(mode)),
                         f"{(t.get('decode_spread') or {}).get(mode, float('nan')):.1%}",
                         _num((t.get("prefill_ms") or {}).get(mode), 0), over or "-", quality])
        lines += table(["model", "mode", "compile s", "tokens vs its quantised model", "decode tok/s", "spread",
                         "prefill ms", "ratio", "quality against the float model"], rows)
    return lines


def gpu_lines(secs: dict) -> list[str]:
    lines = []
    for step in sorted(s for s in secs if s.startswith("gpu_")):
        sec = secs[step]
        gens = [(k, v) for k, v in sec.items() if isinstance(v, dict) and "decode_tok_s" in v]
        kern = (sec.get("triton_kernels_vs_torch") or {}).get("rows", [])
        lines += [f"## On a lent GPU ({step})", "", f"{sec.get('date')}, {sec.get('gpu')}, "
                  + ", ".join(f"{k} {v}" for k, v in (sec.get('versions') or {}).items()) + ".", ""]
        if gens:
            lines += table(["run", "model", "dtype", "budget", "decode tok/s egraft / HF eager",
                             "egraft over HF eager", "prefill ms egraft / HF eager"],
                            [[k, g.get("model"), g.get("dtype"), g.get("budget"), _pair(g["decode_tok_s"]),
                              (g.get("vs_hf_eager") or {}).get("text", "-"), _pair(g.get("prefill_ms"), digits=1)]
                             for k, g in gens])
        if kern:
            lines += [f"Triton kernels, default knobs, not searched: `{sec['triton_kernels_vs_torch']['command']}`"
                      " (ms):", ""]
            lines += table(["workload", "kernels", "egraft Triton", "torch eager", "torch.compile",
                             "egraft's time over eager's", "rel. error"],
                            [[k["workload"], k["kernels"], k["egraft_ms"], k["eager_ms"], k["torch_compile_ms"],
                              f"{k['egraft_ms'] / k['eager_ms']:.1f} times", k["rel_err"]] for k in kern])
    return lines


def readme_rows(secs: dict) -> list[list]:
    """The README's table: per model and precision of the HEADLINE runs, egraft, llama.cpp and HF eager."""
    rows = []
    for step in HEADLINE:
        sec = secs.get(step)
        if not sec or sec.get("status", "ok") != "ok":
            continue
        for r in sec["rows"]:
            by = {run["threads"]: run for run in r["runs"]}
            one, two = by.get(1), by.get(2)
            if one is None:
                continue
            llama = next(iter(_llama(one)), None)

            def both(key):
                return " / ".join(_num(run["decode_tok_s"].get(key)) if run else "-" for run in (one, two))

            rows.append([f"{SHORT.get(r['model'], r['model'])} {r['precision']}", both("egraft"),
                         f"{llama.removeprefix('llama.cpp ')} {both(llama)}" if llama else "-",
                         _num(one["decode_tok_s"].get("hf_eager")), f"{_bound(one)} / {_bound(two)}"])
    return rows


def _bound(run: dict | None) -> str:
    """A run's decode bound in tok/s; "n/a †" where a system decoded faster (the bandwidth was read low)."""
    b = (run or {}).get("decode_bound") or {}
    if not ingest.finite(b.get("tok_s")):
        return "-"
    fastest = max((v for v in run["decode_tok_s"].values() if ingest.finite(v)), default=0.0)
    return _num(b["tok_s"], 0) if fastest <= 1.05 * b["tok_s"] else "n/a †"


def readme_lines(secs: dict) -> list[str]:
    rows = readme_rows(secs)
    if not rows:
        return []
    runs = [secs[s] for s in HEADLINE if s in secs]
    comp = [r["compile"] for sec in runs for r in sec["rows"] if ingest.finite(r["compile"].get("compile_s"))]
    loads = [r["load"] for sec in runs for r in sec["rows"] if ingest.finite(r["load"].get("load_s"))]
    host = runs[0].get("host", {})
    lines = [f"Deployed sizes ({', '.join(sorted({s.get('date') for s in runs}))}, {host.get('cpu', '?')} "
             f"({host.get('cpu_id', '')}), `make bench-peers`; random weights at the shapes of a 135 M Llama and a "
             "494 M Qwen2 model, batch 1, decode tokens/s, medians of interleaved rounds):", ""]
    lines += table(["model, precision", "egraft, 1 core / 2", "llama.cpp, 1 core / 2", "HF eager, 1 core",
                     "bound, 1 core / 2"], rows)
    if any("†" in c for r in rows for c in r):
        lines += ["† a system decoded faster than the bound: the read bandwidth measured in that process was low, "
                  "so it is no bound there.", ""]
    art = [r["compile"]["artifact_over_weights"] for sec in runs for r in sec["rows"]
           if r["precision"] in UNQUANTISED and ingest.finite(r["compile"].get("artifact_over_weights"))]
    if comp and loads and art:
        lines += [f"Compile {min(c['compile_s'] for c in comp):.0f}-{max(c['compile_s'] for c in comp):.0f} s on "
                  f"one core (budget 60 s), peak RSS at most {max(c['peak_rss'] for c in comp) / 1e9:.1f} GB; "
                  f"the artifact is {min(art):.3f}-{max(art):.3f} times the weights (unquantised); a fresh "
                  f"process loads it in {min(x['load_s'] for x in loads):.1f}-{max(x['load_s'] for x in loads):.1f}"
                  " s." + _gpu_sentence(secs), ""]
    return lines


def _gpu_sentence(secs: dict) -> str:
    step, key = GPU_HEADLINE
    g = (secs.get(step) or {}).get(key) or {}
    dec = g.get("decode_tok_s") or {}
    if not (ingest.finite(dec.get("egraft")) and ingest.finite(dec.get("hf_eager"))):
        return ""
    return (f" On one {secs[step].get('gpu', 'GPU')} the {SHORT.get(g.get('model'), g.get('model'))} model in "
            f"{g.get('dtype')} decodes at {dec['egraft']:.0f} tok/s against HF eager's {dec['hf_eager']:.0f}.")
