"""The manifest names its loader module (``target["loader"]``, from the backend's record); a load imports
that module, and every way it can be wrong is a clear ``ArtifactError``."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from egraft import backends
from egraft.backends.artifact import save_artifact
from egraft.errors import ArtifactError
from egraft.ir import GraphBuilder, evaluate
from egraft.runtime import LEGACY_LOADERS, load
from egraft.testing import assert_close


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    b = GraphBuilder()
    x = b.input("x", (2, 5), "float32")
    w = b.weight("w", np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32))
    g = b.build([(x @ w).exp2()])
    d = save_artifact(backends.lower(g, "jax", "cpu"), str(tmp_path_factory.mktemp("jax") / "art"))
    x = np.random.default_rng(1).standard_normal((2, 5)).astype(np.float32)
    return g, x, d


def _variant(d, tmp_path, **target) -> str:
    """A copy of the artifact in `d` whose manifest's target has `target` applied (None: key removed)."""
    dst = str(tmp_path / "copy")
    shutil.copytree(d, dst)
    path = os.path.join(dst, "manifest.json")
    m = json.load(open(path))
    for k, v in target.items():
        if v is None:
            m["target"].pop(k, None)
        else:
            m["target"][k] = v
    json.dump(m, open(path, "w"))
    return dst


def test_the_manifest_names_the_records_loader(saved):
    g, x, d = saved
    art = load(d)
    assert art.manifest["target"]["loader"] == backends.get_backend("jax").loader == "egraft.runtime.jax_loader"
    assert_close(art(x), evaluate(g, [x]), ["float32"], what="jax artifact")


@pytest.mark.parametrize("name", sorted(LEGACY_LOADERS))
def test_every_own_backend_records_the_loader_the_compatibility_table_names(name):
    assert backends.get_backend(name).loader == LEGACY_LOADERS[name]


def test_an_artifact_written_before_the_loader_field_loads_by_backend_name(saved, tmp_path):
    g, x, d = saved
    old = _variant(d, tmp_path, loader=None)
    art = load(old)
    assert "loader" not in art.manifest["target"]
    assert_close(art(x), evaluate(g, [x]), ["float32"], what="legacy jax artifact")


def test_an_unknown_backend_without_a_loader_is_refused(saved, tmp_path):
    with pytest.raises(ArtifactError, match=r"backend 'tvm'.*names no loader module"):
        load(_variant(saved[-1], tmp_path, backend="tvm", loader=None))


def test_a_loader_that_does_not_import_is_named(saved, tmp_path):
    with pytest.raises(ArtifactError, match=r"loader module 'egraft_no_such_loader'.*cannot be imported"):
        load(_variant(saved[-1], tmp_path, loader="egraft_no_such_loader"))


def test_a_module_that_is_not_a_loader_is_refused(saved, tmp_path):
    # json has a load() but no files(): not a loader, and nothing of it is called
    with pytest.raises(ArtifactError, match=r"names 'json' as its loader.*no files\(\)"):
        load(_variant(saved[-1], tmp_path, loader="json"))
