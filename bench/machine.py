"""What the results page states about the machine: CPU, cores, memory, read bandwidth, peak FLOP/s, versions.

The bandwidth and the peak are measured, never read from a datasheet, each
in a process of its own pinned the way the benchmarks pin theirs
(``egraft.measure.fix_threads``: 1 thread on one core, 2 on both), since a
CPU's clock and its share of the memory bus depend on how many cores are
busy:

* read bandwidth: the faster of a numpy sum and a BLAS matrix-vector product
  over a 256 MiB float32 array split over the pinned threads (one stream
  against many rows at once, as a decode step reads its weights;
  ``bench/generate_worker.py bandwidth``: the same number
  the generation benchmark's decode bound divides by), median and spread
  of the repeats;
* peak float32 FLOP/s: ``egraft.measure.calibrate.calibrate_cpu`` (square
  GEMMs through numpy's BLAS and XLA's dot, the faster, best of repeats: a
  peak is the best observed), the number the search's roofline uses;
* on ``--device cuda``: the GPU's name and the datasheet peak egraft uses
  for it (``egraft.measure.specs.cuda_spec``), since a GPU's are published.

    python3 bench/machine.py --threads 1 --out FILE     # one pinned measurement (what the suite runs)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

def versions() -> dict:
    """The benchmarks' library versions (bench/envelope.py), matplotlib's, and this checkout's commit."""
    from importlib import metadata

    import envelope

    out = envelope.versions()
    try:
        out["matplotlib"] = metadata.version("matplotlib")
    except metadata.PackageNotFoundError:
        out["matplotlib"] = None
    out["egraft"] = git_commit()
    return out


def git_commit() -> str:
    """This checkout's short commit, with "+uncommitted" when the measured code (egraft/, bench/,
    pyproject.toml) differs from it; the results the benchmarks write (docs/, README.md) do not count."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                "egraft", "bench", "pyproject.toml"], cwd=ROOT,
                               capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + ("+uncommitted" if dirty.strip() else "")


def host() -> dict:
    """CPU model (and which one of that name: family, model, vector extensions), logical cores, memory and OS.

    Hosts that all call themselves "AMD EPYC" differ (a Zen 3 with AVX2 only,
    a Zen 4 with AVX-512): XLA's kernels, and so the winners and speeds
    measured, differ between them, so every result names which it ran on.
    """
    cpu, mem, fields = "unknown CPU", None, {}
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if not ln.strip():
                    break  # the first processor's block
                k, _, v = ln.partition(":")
                fields[k.strip()] = v.strip()
        cpu = fields.get("model name", cpu)
        with open("/proc/meminfo") as f:
            mem = int(next(ln.split()[1] for ln in f if ln.startswith("MemTotal"))) / 2 ** 20
    except (OSError, StopIteration, ValueError):
        pass
    flags = set(fields.get("flags", "").split())
    simd = [x for x in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if x in flags]
    cpu_id = (f"family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields and "model" in fields
              else platform.machine())
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return {"cpu": cpu, "cpu_id": f"{cpu_id}, {' '.join(simd) or 'no AVX2'}", "logical_cores": os.cpu_count(),
            "cores_allowed": cores, "memory_gib": round(mem, 1) if mem else None,
            "os": f"{platform.system()} {platform.release()}"}


def host_line(h: dict) -> str:
    """The host as one line of a report: "AMD EPYC (family 25 model 1, avx2), 2 logical cores, 23.5 GiB, Linux ..."."""
    cpu = f"{h.get('cpu')} ({h['cpu_id']})" if h.get("cpu_id") else h.get("cpu")
    return f"{cpu}, {h.get('logical_cores')} logical cores, {h.get('memory_gib')} GiB, {h.get('os')}"


def _measure(threads: int, repeats: int, calibrate_s: float) -> dict:
    """In this process, pinned to `threads` cores: read bandwidth (median, spread) and calibrated peak FLOP/s."""
    import generate_worker  # pins to `threads` cores before numpy's threads start

    bw = generate_worker.bandwidth(argparse.Namespace(threads=threads, repeats=repeats))
    from egraft.measure import summarize
    from egraft.measure.calibrate import calibrate_cpu

    rates = summarize([bw["bytes"] / s for s in bw["seconds"]])
    spec = calibrate_cpu(seconds=calibrate_s)
    return {"threads": threads, "cores": bw["cores"],
            "read_bandwidth": {"median": rates.median, "spread": rates.spread, "n": rates.n,
                               "samples": list(rates.samples), "unit": "B/s",
                               "how": f"{bw['reader']} over a 256 MiB float32 array (the faster of {' and '.join(bw['readers'])})"},
            "peak_flops_float32": spec.flops["float32"], "copy_bandwidth": spec.bandwidth,
            "peak_how": spec.source}


def measure(threads: int, repeats: int = 9, calibrate_s: float = 2.0, timeout: float = 300) -> dict:
    """:func:`_measure` in a fresh pinned process (so the pinning never leaks into the caller)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "machine.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--threads", str(threads), "--repeats", str(repeats),
               "--calibrate-s", str(calibrate_s), "--out", out]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
        if p.returncode != 0 or not os.path.exists(out):
            last = (p.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"measuring the machine on {threads} core(s) failed (exit {p.returncode}): {last}")
        with open(out) as f:
            return json.load(f)


def gpu() -> dict | None:
    """The CUDA device torch sees, with the peak egraft's roofline uses for it; None when there is none."""
    import torch

    if not torch.cuda.is_available():
        return None
    from egraft.measure.specs import cuda_spec

    spec = cuda_spec(0)
    return {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
            "peak_flops": dict(spec.flops) if spec else None, "bandwidth": spec.bandwidth if spec else None,
            "peak_how": spec.source if spec else "no datasheet entry for this GPU"}


def describe(threads: list[int], device: str = "cpu", repeats: int = 9, calibrate_s: float = 2.0) -> dict:
    """Everything the page's header says about this machine, measured now."""
    out = {"date": datetime.date.today().isoformat(), "host": host(), "versions": versions(),
           "per_threads": {str(t): measure(t, repeats, calibrate_s) for t in threads}}
    if device == "cuda":
        out["gpu"] = gpu()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--calibrate-s", type=float, default=2.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    res = _measure(a.threads, a.repeats, a.calibrate_s)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
