"""Triton artifacts: generated kernel sources + a launch plan, run here in Triton's interpreter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from runtime_helpers import ROOT, build, flat, random_args

from egraft.errors import ArtifactError
from egraft.runtime import load
from egraft.testing import assert_close, fresh_seed


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from egraft.backends.triton import interpreter_active

    assert interpreter_active(), "tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported"
    return build("dict_heads", "triton", str(tmp_path_factory.mktemp("triton") / "art"), ptx_archs=(90,))


def test_round_trip_in_the_interpreter(saved):
    model, args, g, ex, d = saved
    art = load(d)
    seed = fresh_seed()
    ins = random_args(g, np.random.default_rng(seed))
    out_dtypes = [dt for _, dt in g.output_types()]
    assert_close(art.run_flat(*ins), ex(*ins), out_dtypes, tol=0.0, what=f"loaded vs executable (seed={seed})")
    y = art(*args)
    with torch.no_grad():
        ref = model(*args)
    assert isinstance(y, dict) and y["extra"][1] is None
    assert_close([t.numpy() for t in flat(y)], [t.numpy() for t in flat(ref)], out_dtypes, graph=g,
                 what="loaded vs eager")


def test_manifest_describes_every_launch(saved):
    _, _, g, ex, d = saved
    m = json.load(open(os.path.join(d, "manifest.json")))
    assert [k["name"] for k in m["kernels"]] == [k.name for k in ex.kernels]
    bufs = {b["id"]: b for b in m["launch"]["buffers"]}
    for k, spec in zip(m["kernels"], ex.kernels):
        assert open(os.path.join(d, k["file"])).read() == spec.source
        assert k["reads"] == list(spec.inputs) and k["writes"] == spec.root and k["grid"] == [spec.grid]
        assert all(i in bufs for i in k["reads"]) and bufs[k["writes"]]["kind"] == "kernel"
        assert (k["num_warps"], k["num_stages"], k["constexprs"]) == (spec.num_warps, spec.num_stages, spec.constexprs)
    assert m["launch"]["outputs"] == list(ex.main.outputs)
    # PTX for sm_90, one file per kernel, each hashed in the manifest
    assert m["launch"]["ptx_archs"] == [90] and m["launch"]["ptx_failures"] == []
    ptx = sorted(f for f in m["files"] if f.startswith("ptx/"))
    assert ptx == sorted(f"ptx/{k.name}.sm_90.ptx" for k in ex.kernels)
    assert all(".entry" in open(os.path.join(d, f)).read() for f in ptx)


def test_tampered_kernel_source(saved, tmp_path):
    d = str(tmp_path / "copy")
    shutil.copytree(saved[-1], d)
    k = json.load(open(os.path.join(d, "manifest.json")))["kernels"][0]["file"]
    with open(os.path.join(d, k), "a") as f:
        f.write("\n# edited\n")
    with pytest.raises(ArtifactError, match=rf"{k} was modified after the artifact was written"):
        load(d)


def test_without_the_interpreter_the_error_says_how(saved):
    d = saved[-1]
    code = ("import os, sys\nos.environ.pop('TRITON_INTERPRET', None)\nimport egraft.runtime\n"
            "from egraft.errors import ArtifactError\n"
            f"try:\n    egraft.runtime.load({d!r})\nexcept ArtifactError as e:\n    print('ERR', e)\n"
            "print('MODS', sorted(m for m in sys.modules if m.split('.')[0] in ('egglog', 'deap', 'jax')"
            " or m.startswith(('egraft.backends', 'egraft.frontend', 'egraft.search', 'egraft.rewrites'))))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert "ERR" in p.stdout and "TRITON_INTERPRET=1" in p.stdout, p.stdout + p.stderr
    assert "MODS []" in p.stdout, p.stdout + p.stderr
