"""The ``vllm.general_plugins`` hook, without vLLM: the entry point, the backend name, artifacts as custom ops.

vLLM itself is not installed and never imported here; what vLLM would do
with the hook (call ``register()`` in each process, then resolve
``compilation_config.backend="egraft"`` through torch's backend registry)
is reproduced with torch alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest
import torch
from torch import nn

import egraft
from egraft.backends import lower
from egraft.backends.artifact import save_artifact
from egraft.errors import ArtifactError
from egraft.plugins import vllm
from egraft.runtime import outputs
from egraft.testing import fresh_seed, rel_err
from plugin_helpers import FAST

# what a process that only serves artifacts must not import
COMPILER = ("egraft.frontend", "egraft.rewrites", "egraft.search", "egraft.backends", "egraft.ir.egraph",
            "egraft.testing", "egraft.plugins.dynamo")


def _save(model, args, directory, name) -> str:
    g = egraft.trace(model, args)
    with torch.no_grad():
        tree = outputs.describe(model(*args))
    return save_artifact(lower(g, "torch", "cpu"), directory, meta={"model": name, "output_tree": tree})


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Two saved artifacts: (model, example args, directory) each."""
    root = tmp_path_factory.mktemp("artifacts")
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).eval()
    norm = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 4)).eval()
    out = []
    for name, m in (("mlp", mlp), ("norm", norm)):
        args = (torch.randn(3, 8),)
        out.append((m, args, _save(m, args, str(root / name), name)))
    return out


@pytest.fixture
def no_vllm(monkeypatch):
    """Make ``import vllm`` fail, whatever is installed: the hook must not need it."""
    monkeypatch.setitem(sys.modules, "vllm", None)


def test_entry_point_is_registered():
    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "egraft"]
    assert ep.value == "egraft.plugins.vllm:register"
    assert ep.load() is vllm.register


def test_register_without_vllm_and_without_artifacts(no_vllm, monkeypatch):
    monkeypatch.delenv(vllm.ARTIFACTS_ENV, raising=False)
    assert vllm.register() == {}
    assert "egraft" in torch._dynamo.list_backends(exclude_tags=())


def test_register_provides_the_backend_name_when_no_entry_point_does(no_vllm, monkeypatch):
    """From a source tree (no installed entry points) the hook registers the name itself, compiling lazily."""
    from torch._dynamo.backends import registry

    torch._dynamo.list_backends()  # torch reads the installed entry points once; then they are hidden
    monkeypatch.setattr(registry, "_BACKENDS", {k: v for k, v in registry._BACKENDS.items() if k != "egraft"})
    monkeypatch.setattr(registry, "_COMPILER_FNS", {k: v for k, v in registry._COMPILER_FNS.items() if k != "egraft"})
    monkeypatch.delenv(vllm.ARTIFACTS_ENV, raising=False)
    assert "egraft" not in torch._dynamo.list_backends(exclude_tags=())
    vllm.register()
    vllm.register()  # a second call (vLLM calls plugins per process) must not fail on a duplicate name
    assert registry.lookup_backend("egraft") is vllm._lazy_backend
    torch.manual_seed(fresh_seed())
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        got = torch.compile(model, backend="egraft", options=FAST)(x)
        assert rel_err(got.numpy(), model(x).numpy()) < 1e-4


def test_register_loads_the_artifacts_of_the_environment_as_custom_ops(no_vllm, monkeypatch, artifacts):
    (mlp, mlp_args, mlp_dir), (norm, norm_args, norm_dir) = artifacts
    monkeypatch.setenv(vllm.ARTIFACTS_ENV, os.pathsep.join([mlp_dir, f"egraft_test_norm={norm_dir}"]))
    ops = vllm.register()
    assert list(ops) == [mlp_dir, f"egraft_test_norm={norm_dir}"]
    assert hasattr(torch.ops.egraft, "egraft_test_norm"), "NAME=DIR names the op"
    g = torch.Generator().manual_seed(fresh_seed())
    for (model, args, _), op in zip(artifacts, ops.values()):
        x = torch.randn(*args[0].shape, generator=g)
        with torch.no_grad():
            want = model(x)
        assert rel_err(op(x).numpy(), want.numpy()) < 1e-4
        # one node for Dynamo: the op inside a torch.compile'd forward
        compiled = torch.compile(lambda t, op=op: op(t) * 2.0, backend="eager", fullgraph=True)
        assert rel_err(compiled(x).numpy(), (want * 2.0).numpy()) < 1e-4
    assert vllm.register() == ops, "registering again returns the same ops"


def test_the_hook_keeps_a_serving_process_light(artifacts, tmp_path):
    """vLLM's way in a fresh process: load the entry point, call it; no compiler module is imported."""
    (mlp, args, directory), _ = artifacts
    torch.save(args[0], tmp_path / "x.pt")
    code = textwrap.dedent(f"""
        import json, sys, torch
        from importlib.metadata import entry_points
        (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "egraft"]
        ops = ep.load()()
        y = list(ops.values())[0](torch.load({str(tmp_path / "x.pt")!r}))
        torch.save(y, {str(tmp_path / "y.pt")!r})
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("egglog", "deap", "vllm")
                       or m.startswith({COMPILER!r}))
        print(json.dumps(heavy))
    """)
    env = {**os.environ, vllm.ARTIFACTS_ENV: directory}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    with torch.no_grad():
        assert rel_err(torch.load(tmp_path / "y.pt").numpy(), mlp(args[0]).numpy()) < 1e-4


def test_a_missing_artifact_fails_the_registration(no_vllm, monkeypatch, tmp_path):
    missing = str(tmp_path / "no-such-artifact")
    monkeypatch.setenv(vllm.ARTIFACTS_ENV, missing)
    with pytest.raises(ArtifactError, match="no-such-artifact"):
        vllm.register()


def test_artifact_entries_parse():
    sep = os.pathsep
    assert vllm.artifact_entries(f"a{sep}{sep} b=c {sep}") == [(None, "a"), ("b", "c")]
    assert vllm.artifact_entries("") == []
