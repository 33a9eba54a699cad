"""A CPU JAX artifact keeps the executable XLA compiled; egraft.load uses it only on the host that compiled it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from runtime_helpers import build, random_args

from egraft.errors import ArtifactError
from egraft.runtime import bundled, load
from egraft.testing import assert_close, fresh_seed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture()
def saved(tmp_path):
    made = build("gpt2_block", "jax", str(tmp_path / "art"), seed=fresh_seed() % 1000)
    assert "executable" not in _entry(made[-1])  # only asked for
    done = bundled.keep(made[-1])
    assert list(done) == [made[-1]] and done[made[-1]].startswith("kept ("), done
    return made


def _entry(d):
    with open(os.path.join(d, "manifest.json")) as f:
        return json.load(f)["kernels"][0]


def _same_answers(art, g, ex):
    seed = fresh_seed()
    ins = random_args(g, np.random.default_rng(seed))
    assert_close(art.run_flat(*ins), ex(*ins), [dt for _, dt in g.output_types()], tol=0.0,
                 what=f"loaded vs executable (seed={seed})")


def test_the_executable_is_kept_and_a_load_on_this_host_uses_it(saved):
    _, _, g, ex, d = saved
    kept = _entry(d)["executable"]
    assert kept["file"] == bundled.EXECUTABLE_FILE and kept["host"] == bundled.host()
    art = load(d)
    assert art.runner.loaded == "the executable kept in the artifact"
    _same_answers(art, g, ex)


def test_a_fresh_process_loads_the_kept_executable(saved):
    _, _, _, _, d = saved
    script = ("import egraft, json, sys; a = egraft.load(sys.argv[1]); print(json.dumps(a.runner.loaded))")
    out = subprocess.run([sys.executable, "-c", script, d], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == "the executable kept in the artifact"


def test_another_hosts_executable_is_compiled_here_instead(saved):
    _, _, g, ex, d = saved
    path = os.path.join(d, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    m["kernels"][0]["executable"]["host"]["flags"] = "0" * 16  # a CPU with other instructions
    with open(path, "w") as f:
        json.dump(m, f)
    art = load(d)
    assert art.runner.loaded == "compiled here (compiled on another host (its flags differ))"
    _same_answers(art, g, ex)


def test_the_switch_compiles_here(saved, monkeypatch):
    _, _, g, ex, d = saved
    monkeypatch.setenv(bundled.ENV_VAR, "0")
    art = load(d)
    assert art.runner.loaded == f"compiled here ({bundled.ENV_VAR}=0)"
    _same_answers(art, g, ex)


@pytest.mark.parametrize("case", ["this host", "other host", "switched off"])
def test_a_corrupt_executable_is_refused_on_any_host(saved, case, monkeypatch):
    """Checked whether or not the load uses it."""
    _, _, _, _, d = saved
    if case == "switched off":
        monkeypatch.setenv(bundled.ENV_VAR, "0")
    if case == "other host":
        path = os.path.join(d, "manifest.json")
        with open(path) as f:
            m = json.load(f)
        m["kernels"][0]["executable"]["host"]["cpu"] = "another CPU"
        with open(path, "w") as f:
            json.dump(m, f)
    with open(os.path.join(d, bundled.EXECUTABLE_FILE), "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(ArtifactError, match=bundled.EXECUTABLE_FILE):
        load(d)


# --- the generated CPU products' machine code, kept beside the executable ----------------------------------------

@pytest.fixture()
def with_kernels(tmp_path):
    made = build("gpt2_block", "jax", str(tmp_path / "art"), seed=fresh_seed() % 1000, knobs={"stream": "llvm"})
    assert _entry(made[-1]).get("cpu_kernels"), "the program calls no generated product"
    done = bundled.keep(made[-1])
    assert done[made[-1]].endswith(" kernels)"), done
    return made


def _load_elsewhere(d, tmp_path, ins, env=None):
    """Load `d` in a fresh process with an empty egraft cache directory (a new machine's first load): its outputs
    for `ins` and where its kernels' machine code came from (llvm_kernels.STATS)."""
    np.savez(tmp_path / "ins.npz", *ins)
    script = ("import egraft, json, sys, numpy as np; from egraft.runtime import llvm_kernels as lk; "
              "a = egraft.load(sys.argv[1]); z = np.load(sys.argv[2]); "
              "outs = a.run_flat(*[z[f'arr_{i}'] for i in range(len(z.files))]); "
              "np.savez(sys.argv[3], *[np.asarray(o) for o in outs]); print(json.dumps(lk.STATS))")
    cache = tmp_path / f"cache{len(os.listdir(tmp_path))}"
    out = subprocess.run([sys.executable, "-c", script, d, str(tmp_path / "ins.npz"), str(tmp_path / "outs.npz")],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": ROOT, "EGRAFT_CACHE_DIR": str(cache), **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    got = np.load(tmp_path / "outs.npz")
    return [got[f"arr_{i}"] for i in range(len(got.files))], json.loads(out.stdout.strip().splitlines()[-1])


def test_the_kernels_machine_code_is_kept_and_a_new_machine_does_not_compile_them(with_kernels, tmp_path):
    from egraft.runtime import llvm_kernels as lk

    _, _, g, ex, d = with_kernels
    entry = _entry(d)
    specs = [lk.KernelSpec.from_json(s) for s in entry["cpu_kernels"]]
    objects = entry["executable"]["objects"]
    assert [o["key"] for o in objects] == [lk.object_key(s) for s in specs]
    assert all(os.path.getsize(os.path.join(d, o["file"])) > 0 for o in objects)
    ins = random_args(g, np.random.default_rng(fresh_seed()))
    want = ex(*ins)
    got, stats = _load_elsewhere(d, tmp_path, ins)
    assert stats == {"compiled": 0, "cached": 0, "kept": len(specs)}, stats
    assert_close(got, want, [dt for _, dt in g.output_types()], tol=0.0, what="kept kernels")
    got, stats = _load_elsewhere(d, tmp_path, ins, {bundled.ENV_VAR: "0"})  # switched off: compiled
    assert stats["compiled"] == len(specs) and stats["kept"] == 0, stats


def test_another_cpus_machine_code_is_never_used(with_kernels, tmp_path):
    """An entry whose key is not this host's (another CPU, IR or LLVM) is offered but never matches: compiled."""
    from egraft.runtime.manifest import write_manifest

    _, _, g, ex, d = with_kernels
    with open(os.path.join(d, "manifest.json")) as f:
        m = json.load(f)
    for o in m["kernels"][0]["executable"]["objects"]:
        o["key"] = "0" * 64
    write_manifest(d, {k: v for k, v in m.items() if k not in ("format", "format_version", "egraft_version", "files")})
    ins = random_args(g, np.random.default_rng(fresh_seed()))
    got, stats = _load_elsewhere(d, tmp_path, ins)
    assert stats["kept"] == 0 and stats["compiled"] == len(m["kernels"][0]["cpu_kernels"]), stats
    assert_close(got, ex(*ins), [dt for _, dt in g.output_types()], tol=0.0, what="compiled kernels")


def test_a_damaged_kernel_object_is_refused(with_kernels):
    _, _, _, _, d = with_kernels
    rel = _entry(d)["executable"]["objects"][0]["file"]
    with open(os.path.join(d, rel), "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(ArtifactError, match=rel.split("/")[-1]):
        load(d)
