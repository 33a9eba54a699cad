"""One copy of the weights: every program of a compiled generation binds the model's own weight memory and the forms
derived from it once; the saved generation stores each tensor once and derived forms as recipes; a loaded one maps
the file and shares every array between its programs.  A bfloat16 model goes the same way end to end."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from compiled_helpers import left_padded, reference, tiny

import egraft
from egraft.errors import InputError
from egraft.runtime.weights import WEIGHTS_FILE

GREEDY = dict(max_new_tokens=6, do_sample=False)


def _model_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def _compile(model, search_cache, **kw):
    return egraft.compile(model, device="cpu", backend="jax", budget="1s", max_batch=2, max_length=64,
                          chunks=(1, 4), contexts=(32,), cache=search_cache, progress=False, **kw)


@pytest.fixture(scope="module")
def llama(search_cache):
    model = tiny("llama")
    return model, _compile(model, search_cache)


def _host_arrays(cm):
    return {b: p.executable._host for b, p in cm.generation.programs.items()}


def test_every_program_binds_the_model_memory_and_shares_derived_forms(llama):
    model, cm = llama
    params = {p.data_ptr() for p in model.parameters()}
    hosts = _host_arrays(cm)
    bound = {a.ctypes.data for arrays in hosts.values() for a in arrays}
    assert params & bound, "no program binds a parameter's own memory"
    # the same derived form (the same recipe over the same source arrays: a folded value, a panel form) is the
    # same array in every program that binds it
    from egraft.runtime.derived import provenance

    by_recipe: dict = {}
    for arrays in hosts.values():
        for a in arrays:
            made = provenance(a)
            if made is not None:
                recipe, params, sources = made
                key = (recipe, json.dumps(params, sort_keys=True), tuple(id(x) for _, x in sources))
                by_recipe.setdefault(key, set()).add(id(a))
    assert by_recipe, "no program binds a derived form"
    assert all(len(ids) == 1 for ids in by_recipe.values()), "one recipe made twice"


def test_a_weight_updated_in_place_after_compiling_is_refused(search_cache):
    model = tiny("llama")
    cm = _compile(model, search_cache)
    ids, mask = left_padded([5, 3], seed=7)
    assert cm.generate(ids, attention_mask=mask, **GREEDY).tolist() == reference(model, ids, mask, **GREEDY).tolist()
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    with pytest.raises(InputError, match=r"updated in place after egraft.compile \(a \(128, 64\) torch.float32 "
                                         r"tensor\).*compile the model again"):
        cm.generate(ids, attention_mask=mask, **GREEDY)


def test_the_saved_generation_stores_each_tensor_once_and_loads_shared(llama, tmp_path):
    model, cm = llama
    d = cm.save(tmp_path / "gen")
    files = sorted(os.listdir(d))
    assert WEIGHTS_FILE in files
    steps = [f for f in files if f.startswith("step_")]
    assert len(steps) == len(cm.generation.programs)
    assert not any(os.path.exists(os.path.join(d, s, WEIGHTS_FILE)) for s in steps)  # one file for all programs
    size = os.path.getsize(os.path.join(d, WEIGHTS_FILE))
    assert size <= 1.05 * _model_bytes(model) + 4096  # derived forms are recipes, not tensors
    art = egraft.load(d)
    ids, mask = left_padded([6, 2], seed=3)
    assert art.generate(ids, attention_mask=mask, **GREEDY).tolist() == reference(model, ids, mask, **GREEDY).tolist()
    _assert_shared(art)


def _assert_shared(art):
    """One array per tensor or recipe, whichever program binds it."""
    seen: dict = {}
    for a in art.steps.values():
        for spec, w in zip(a.manifest["weights"], a.runner.host):
            key = spec.get("tensor") or repr(spec["derived"])
            assert seen.setdefault(key, w) is w, key[:200]
    assert any("derived" in s for a in art.steps.values() for s in a.manifest["weights"])


def test_the_first_load_after_a_save_reads_the_hash_the_save_computed(llama, tmp_path, monkeypatch):
    from egraft.runtime import hashed

    monkeypatch.delenv(hashed.ENV_VAR, raising=False)
    reads = []
    real = hashed.sha256_file
    monkeypatch.setattr(hashed, "sha256_file", lambda p: reads.append(p) or real(p))
    d = llama[1].save(tmp_path / "gen")
    egraft.load(d)
    assert reads == []  # (the weights file was hashed as it was written: runtime.hashed.remember_written)


def test_the_programs_load_on_threads_before_torch_is_imported(llama, tmp_path):
    """A load starts its JAX programs (XLA's compiles, off the GIL) on threads before the runtime imports torch, so
    the two overlap; those loads themselves import no torch (checked in a fresh process)."""
    import subprocess
    import sys

    model, cm = llama
    d = cm.save(tmp_path / "gen")
    ids, mask = left_padded([5, 3], seed=5)
    want = reference(model, ids, mask, **GREEDY).tolist()
    code = f"""if True:
        import json, sys, threading
        import egraft.runtime as rt
        from egraft.runtime import generation_read
        names = []
        real = rt._load
        rt._load = lambda *a: names.append(threading.current_thread().name) or real(*a)
        started = generation_read.start({str(d)!r}, "cpu", rt.load)
        loaded = started.programs()
        before = "torch" in sys.modules
        from egraft.runtime.generation_artifact import load_generation
        import torch
        art = load_generation(started)
        ids = torch.tensor({ids.tolist()!r}); mask = torch.tensor({mask.tolist()!r})
        out = art.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        print(json.dumps([before, names, len(loaded), out.tolist()]))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    before, names, n, tokens = json.loads(out.stdout.strip().splitlines()[-1])
    assert not before, "a program's load imported torch"
    assert n == len(cm.generation.programs) and len(names) == n
    assert all(name.startswith("egraft-load") for name in names), names
    assert tokens == want


def test_a_load_that_fails_after_its_programs_started_leaves_no_load_running(llama, tmp_path):
    _, cm = llama
    d = cm.save(tmp_path / "gen")
    path = os.path.join(d, "generation.json")
    with open(path) as f:
        doc = json.load(f)
    doc["spec"]["chunks"] = "not a ladder"  # read after the programs started
    with open(path, "w") as f:
        json.dump(doc, f)
    import threading

    with pytest.raises(egraft.errors.ArtifactError, match="step spec is incomplete or malformed"):
        egraft.load(d)
    assert not [t for t in threading.enumerate() if t.name.startswith("egraft-load") and t.is_alive()]


def test_a_step_program_alone_names_the_directory_to_load(llama, tmp_path):
    _, cm = llama
    d = cm.save(tmp_path / "gen")
    step = next(f for f in sorted(os.listdir(d)) if f.startswith("step_"))
    with pytest.raises(egraft.errors.ArtifactError, match="one step program of a saved generation.*load that directory"):
        egraft.load(os.path.join(d, step))


def test_a_bfloat16_model_generates_transformers_tokens_compiled_saved_and_loaded(search_cache, tmp_path):
    model = tiny("llama").to(torch.bfloat16)
    with torch.no_grad():  # random weights give near-tied logits that bfloat16 rounding can flip; a trained
        model.lm_head.weight.mul_(8.0)  # model's greedy choices are clear: scale the output layer so they are
    cm = _compile(model, search_cache)
    ids, mask = left_padded([7, 4], seed=11)
    want = reference(model, ids, mask, **GREEDY).tolist()
    assert cm.generate(ids, attention_mask=mask, **GREEDY).tolist() == want
    d = cm.save(tmp_path / "bf16")
    art = egraft.load(d)
    assert art.spec.state[0].dtype == "bfloat16"  # the caches keep the model's dtype
    # held by the programs as their bits (int16: XLA's CPU backend updates a bfloat16 array through float32)
    for a in art.steps.values():
        roles = [i.get("role") for i in a.manifest["inputs"]]
        held = a.manifest["kernels"][0]["input_program_dtypes"]
        assert {h for h, r in zip(held, roles) if r == "state"} == {"int16"}
        assert all(" scatter(" not in line or "bf16[" not in line.split("=")[1].split(" scatter(")[0]
                   for line in a.runner.compiled.as_text().splitlines())
    assert art.generate(ids, attention_mask=mask, **GREEDY).tolist() == want
    assert {str(x.dtype) for x in art.state} == {"int16"}  # the caches as the calls left them: jax arrays of bits
    assert art.generate(ids, attention_mask=mask, **GREEDY).tolist() == want  # and they serve the next call
    _assert_shared(art)  # panels of an upcast weight included: the upcast made once, kept while its panels live
    assert os.path.getsize(os.path.join(d, WEIGHTS_FILE)) <= 1.05 * _model_bytes(model) + 4096


def test_an_artifact_whose_programs_take_bfloat16_caches_as_they_are_still_generates(search_cache, tmp_path,
                                                                                     monkeypatch):
    """Artifacts saved before half-type caches were held as their bits take them as bfloat16: such a program (made
    here by lowering without the bits) loads and generates transformers' tokens, its caches bfloat16 jax arrays."""
    from egraft.backends.jax import executable, function

    monkeypatch.setattr(executable, "program_dtype", lambda dt, x64, state=False: function.program_dtype(dt, x64))
    model = tiny("llama").to(torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    cm = _compile(model, search_cache)
    d = cm.save(tmp_path / "old")
    monkeypatch.undo()
    art = egraft.load(d)
    assert {h for a in art.steps.values() for h, i in zip(a.manifest["kernels"][0]["input_program_dtypes"],
                                                          a.manifest["inputs"]) if i.get("role") == "state"} == {"bfloat16"}
    ids, mask = left_padded([5, 3], seed=12)
    want = reference(model, ids, mask, **GREEDY).tolist()
    assert art.generate(ids, attention_mask=mask, **GREEDY).tolist() == want
    assert {str(x.dtype) for x in art.state} == {"bfloat16"}


def test_loading_fills_the_xla_cache_a_restarted_server_reads(llama, tmp_path):
    """egraft.load compiles each program with XLA once per machine: the programs land in XLA's persistent cache
    under egraft's cache directory, where the next process's load finds them."""
    from compiled_helpers import run_python

    _, cm = llama
    d = cm.save(tmp_path / "gen")
    code = ("import json, os, egraft; art = egraft.load(%r); "
            "root = os.path.join(os.environ['EGRAFT_CACHE_DIR'], 'xla'); "
            "print(json.dumps({'entries': len(os.listdir(root)) if os.path.isdir(root) else 0}))") % str(d)
    cache = tmp_path / "cache"
    first = run_python(code, env={"EGRAFT_CACHE_DIR": str(cache)})
    assert first["entries"] >= len(cm.generation.programs)
    off = run_python(code, env={"EGRAFT_CACHE_DIR": str(tmp_path / "off"),
                                                         "EGRAFT_XLA_CACHE": "0"})
    assert off["entries"] == 0  # EGRAFT_XLA_CACHE=0 leaves JAX's settings alone


def test_inspect_shows_a_saved_generation_and_its_checked_weights(llama, tmp_path, capsys):
    from egraft.cli import main

    _, cm = llama
    d = cm.save(tmp_path / "gen")
    assert main(["inspect", str(d)]) == 0
    out = capsys.readouterr().out
    assert "egraft-generation v3" in out and "shared by every program; SHA-256 checked: OK" in out
    assert f"programs   {len(cm.generation.programs)}" in out and "derived from them at load" in out
    with open(os.path.join(d, WEIGHTS_FILE), "r+b") as f:  # one byte of the weights changed
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte ^ 0xFF]))
    assert main(["inspect", str(d)]) != 0  # a modified file is an error, as for one artifact
    assert "was modified after the generation was saved" in capsys.readouterr().err
    with pytest.raises(egraft.errors.ArtifactError, match="was modified after the artifact was written"):
        egraft.load(d)


def test_egraft_run_names_what_to_do_with_a_saved_generation(llama, tmp_path, capsys):
    from egraft.cli import main

    _, cm = llama
    d = cm.save(tmp_path / "gen")
    assert main(["run", str(d)]) != 0
    assert "holds a saved generation, which `egraft run` does not call" in capsys.readouterr().err
