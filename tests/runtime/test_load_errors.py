"""What a load checks, and the errors it gives: each names the file or input and says what to do."""

from __future__ import annotations

import json
import os
import shutil
import warnings

import numpy as np
import pytest
import torch
from runtime_helpers import build

from egraft.backends.artifact import save_artifact
from egraft.errors import ArtifactError, InputError
from egraft.runtime import load
from egraft.runtime.manifest import ArtifactVersionWarning, read_manifest


@pytest.fixture(scope="module")
def jax_art(tmp_path_factory):
    return build("dict_heads", "jax", str(tmp_path_factory.mktemp("jax") / "art"))


@pytest.fixture(scope="module")
def torch_art(tmp_path_factory):
    return build("mlp", "torch", str(tmp_path_factory.mktemp("torch") / "art"))


def _copy(d, tmp_path) -> str:
    dst = str(tmp_path / "copy")
    shutil.copytree(d, dst)
    return dst


def _edit_manifest(d, **changes):
    path = os.path.join(d, "manifest.json")
    m = json.load(open(path))
    m.update(changes)
    json.dump(m, open(path, "w"))
    return m


def _flip_byte(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("which", ["jax", "torch"])
@pytest.mark.parametrize("name", ["weights.safetensors", "program"])
def test_tampered_file_is_named(which, name, jax_art, torch_art, tmp_path):
    d = _copy((jax_art if which == "jax" else torch_art)[-1], tmp_path)
    if name == "program":
        name = json.load(open(os.path.join(d, "manifest.json")))["kernels"][0]["file"]
    path = os.path.join(d, name)
    _flip_byte(path, os.path.getsize(path) // 2)
    with pytest.raises(ArtifactError, match=rf"{name} was modified after the artifact was written.*egraft compile"):
        load(d)
    with pytest.raises(ArtifactError, match=f"{name} was modified"):
        read_manifest(d)


def test_missing_file_is_named(torch_art, tmp_path):
    d = _copy(torch_art[-1], tmp_path)
    os.remove(os.path.join(d, "program.pt2"))
    with pytest.raises(ArtifactError, match="program.pt2 is missing from the artifact"):
        load(d)
    shutil.copy(os.path.join(torch_art[-1], "program.pt2"), d)
    os.remove(os.path.join(d, "weights.safetensors"))
    with pytest.raises(ArtifactError, match="weights.safetensors is missing"):
        read_manifest(d)


def test_newer_format_version_says_upgrade(jax_art, tmp_path):
    d = _copy(jax_art[-1], tmp_path)
    _edit_manifest(d, format_version=2, egraft_version="9.0.0")
    with pytest.raises(ArtifactError, match=r"written by egraft 9\.0\.0 with format v2; this egraft reads up to v1: "
                                            r"upgrade egraft"):
        load(d)


def test_a_manifest_from_before_roles_and_aliases_still_loads(jax_art, tmp_path):
    model, args, g, ex, d = jax_art
    d = _copy(d, tmp_path)
    m = json.load(open(os.path.join(d, "manifest.json")))
    del m["aliases"]
    m["inputs"] = [{k: v for k, v in i.items() if k in ("name", "shape", "dtype")} for i in m["inputs"]]
    json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
    art = load(d)
    np.testing.assert_array_equal(art.run_flat(*[a.numpy() for a in args])[0], ex(*[a.numpy() for a in args])[0])


def test_an_alias_to_a_non_state_input_is_refused(jax_art, tmp_path):
    d = _copy(jax_art[-1], tmp_path)
    _edit_manifest(d, aliases=[{"output": 0, "input": "x"}])
    with pytest.raises(ArtifactError, match=r"manifest.json: .* do not form a program signature \(output 0 is "
                                            r"aliased to 'x', which is not a state input"):
        load(d)
    _edit_manifest(d, aliases=[], inputs=[{"name": "x", "role": "cache", "shape": [2], "dtype": "float32"}])
    with pytest.raises(ArtifactError, match="role 'cache'"):
        load(d)


def test_not_an_artifact(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist"):
        load(str(tmp_path / "nowhere"))
    (tmp_path / "f").write_text("x")
    with pytest.raises(ArtifactError, match="is a file"):
        load(str(tmp_path / "f"))
    with pytest.raises(ArtifactError, match="manifest.json is missing: .* is not an egraft artifact"):
        load(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="manifest.json is corrupt"):
        load(str(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "something-else", "format_version": 1}))
    with pytest.raises(ArtifactError, match="format is 'something-else', expected 'egraft-artifact'"):
        load(str(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "egraft-artifact", "format_version": 1}))
    with pytest.raises(ArtifactError, match="lacks the field"):
        load(str(tmp_path))


@pytest.mark.parametrize("doc,match", [
    ([1, 2], r"is not an egraft generation file \(format None, expected 'egraft-generation'"),
    ({"format": "something-else"}, r"is not an egraft generation file \(format 'something-else'"),
    ({"format": "egraft-generation", "format_version": 99}, r"has format_version 99; this egraft reads up to 3"),
    ({"format": "egraft-generation", "format_version": 3, "weights": None}, r"its weights entry is missing"),
])
def test_a_bad_generation_file_is_named_before_any_program_loads(tmp_path, doc, match):
    with open(tmp_path / "generation.json", "w") as f:
        json.dump(doc, f)
    with pytest.raises(ArtifactError, match=match):
        load(tmp_path)


def test_weights_disagreeing_with_the_manifest(jax_art, tmp_path):
    """A manifest whose weight list does not match the (untampered) file: the weight is named."""
    d = _copy(jax_art[-1], tmp_path)
    m = json.load(open(os.path.join(d, "manifest.json")))
    m["weights"][0]["shape"] = [7, 7]
    _edit_manifest(d, weights=m["weights"])
    with pytest.raises(ArtifactError, match=f"weight {m['weights'][0]['name']!r} is .* the manifest says"):
        load(d)


def test_library_versions(jax_art, torch_art, tmp_path):
    """torch's format is not portable across minor versions (error); StableHLO is (a warning, then it runs)."""
    d = _copy(torch_art[-1], tmp_path)
    _edit_manifest(d, backend_versions={"torch": "1.99.0"})
    with pytest.raises(ArtifactError, match=r"written with torch 1\.99\.0; this process has torch .*not portable.*"
                                            r"egraft compile"):
        load(d)
    read_manifest(d, versions=False)  # inspecting it is still possible
    d2 = str(tmp_path / "jax")
    shutil.copytree(jax_art[-1], d2)
    _edit_manifest(d2, backend_versions={"jax": "0.1.0", "jaxlib": "0.1.0"})
    with pytest.warns(ArtifactVersionWarning, match=r"written with jax 0\.1\.0.*portable"):
        art = load(d2)
    args = jax_art[1]
    assert torch.equal(art(*args)["logits"], load(jax_art[-1])(*args)["logits"])
    _edit_manifest(d2, backend_versions={"jax-but-not-installed": "1.0"})
    with pytest.raises(ArtifactError, match="needs jax-but-not-installed .* not installed"):
        load(d2)


def test_wrong_inputs_name_the_input(jax_art, torch_art):
    for _, args, _, _, d in (jax_art, torch_art):
        art = load(d)
        name = art.input_specs[0].name
        x = args[0]
        with pytest.raises(InputError, match=rf"input {name!r} is a tensor of shape \[1, .*expected shape "
                                             rf"\[{x.shape[0]}, .*compiled for shape"):
            art(x[:1], *args[1:])
        with pytest.raises(InputError, match=rf"input {name!r} is a tensor .* dtype float64; expected .* dtype "
                                             r"float32: convert it with \.to\(torch\.float32\)"):
            art(x.double(), *args[1:])
        with pytest.raises(InputError, match=rf"input {name!r} is a numpy array .* dtype int32.*\.astype\(float32\)"):
            art(np.zeros(tuple(x.shape), np.int32), *[a.numpy() for a in args[1:]])
        with pytest.raises(InputError, match=rf"takes {len(args)} input\(s\) \({name}"):
            art(*args, args[0])


def test_save_refuses_a_foreign_directory(torch_art, tmp_path):
    ex = torch_art[3]
    (tmp_path / "mine.txt").write_text("precious")
    with pytest.raises(ArtifactError, match="non-empty directory that does not hold an egraft artifact"):
        save_artifact(ex, str(tmp_path), meta={})
    assert (tmp_path / "mine.txt").read_text() == "precious"
    with pytest.raises(ArtifactError, match="is a file"):
        save_artifact(ex, str(tmp_path / "mine.txt"), meta={})
    with pytest.raises(ArtifactError, match="unknown meta key"):
        save_artifact(ex, str(tmp_path / "new"), meta={"modle": "typo"})
    with pytest.raises(ArtifactError, match="output_tree"):
        save_artifact(ex, str(tmp_path / "new"), meta={"output_tree": {"type": "tuple", "items": []}})
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        save_artifact(ex, str(tmp_path / "empty"), meta={})
    assert sorted(os.listdir(tmp_path / "empty")) == ["manifest.json", "program.pt2", "weights.safetensors"]


def test_devices_that_are_not_there(jax_art, torch_art):
    for _, _, _, _, d in (jax_art, torch_art):
        with pytest.raises(ArtifactError, match="unknown device 'metal'"):
            load(d, device="metal")
    if not torch.cuda.is_available():  # this host has no GPU: both say so instead of failing on the first call
        with pytest.raises(ArtifactError, match="JAX has no cuda device|sees 0 cuda"):
            load(jax_art[-1], device="cuda")
        with pytest.raises(ArtifactError, match="'cuda:0' is not available|'cuda' is not available"):
            load(torch_art[-1], device="cuda")
    with pytest.raises(ArtifactError, match="runs on cpu or cuda, not 'tpu'"):
        load(torch_art[-1], device="tpu")
