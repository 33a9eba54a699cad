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
