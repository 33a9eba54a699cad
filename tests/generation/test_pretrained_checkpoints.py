"""GPTQ and AWQ checkpoints (``egraft.from_pretrained``, ``frontend.packed``): each quantised layer is its
checkpoint's dequantised weight exactly, the model generates the dequantised model's tokens eagerly, compiled and
loaded, and a checkpoint egraft does not read is refused naming what was wrong."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from compiled_helpers import left_padded, reference
from family_models import VOCAB, tiny_family

from egraft.errors import InputError
from egraft.frontend import packed
from egraft.frontend.quantize import QuantizedLinear
from egraft.testing import checkpoints as qc

KW = dict(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)

# (bits, group, sym, checkpoint format, act-order): each layout the reader turns into a different QuantizedLinear
GPTQ_CASES = {
    "4-bit v1 symmetric g32": (4, 32, True, "gptq", False),
    "4-bit v2 zero points g64": (4, 64, False, "gptq_v2", False),
    "4-bit v1 act-order g32": (4, 32, False, "gptq", True),
    "4-bit one group a row": (4, -1, False, "gptq", False),
    "4-bit g256 as groups of 128": (4, 256, False, "gptq_v2", False),
    "8-bit per row": (8, -1, False, "gptq", False),
}


def _layer_tensors(w: np.ndarray, method: str, bits=4, group=32, sym=False, fmt="gptq", act_order=False, seed=0):
    """(the checkpoint tensors of one layer of float weight `w`, the weight they mean)."""
    q, z, s, g_idx = qc.quantize(w, bits, group, sym, np.random.default_rng(seed), act_order)
    if method == "gptq":
        t = {"qweight": qc.pack_rows(q, bits), "qzeros": qc.pack_columns(z - 1 if fmt == "gptq" else z, bits),
             "scales": s, "g_idx": g_idx.astype(np.int32)}
    else:
        t = {"qweight": qc.pack_columns(q, 4, qc.AWQ_PACK), "qzeros": qc.pack_columns(z, 4, qc.AWQ_PACK), "scales": s}
    return {k: torch.from_numpy(v) for k, v in t.items()}, qc.dequantize(q, z, s, g_idx)


@pytest.mark.parametrize("case", sorted(GPTQ_CASES) + ["awq g32", "awq g128"])
def test_a_quantised_layer_is_its_checkpoints_dequantised_weight(case):
    rng = np.random.default_rng(np.random.randint(2**31))  # the test's replayable seed (tests/conftest.py)
    w = rng.standard_normal((48, 512)) * rng.uniform(0.1, 2.0, (48, 1))
    if case.startswith("awq"):
        bits, group = 4, int(case.split("g")[-1])
        t, want = _layer_tensors(w, "awq", group=group, seed=rng.integers(2**31))
        layer = packed.awq("layer", t, group)
    else:
        bits, group, sym, fmt, act = GPTQ_CASES[case]
        t, want = _layer_tensors(w, "gptq", bits, group, sym, fmt, act, seed=rng.integers(2**31))
        layer = packed.gptq("layer", t, bits, group, fmt)
    assert torch.equal(layer.dequantized(), torch.from_numpy(want).to(torch.float32))  # exact, not close
    x = torch.randn(3, 512, dtype=torch.float64)
    got = layer(x.to(torch.float32)).double()
    ref = x @ torch.from_numpy(want).T
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max())), (got - ref).abs().max()
    assert (layer.perm is not None) == ("act-order" in case)
    assert (layer.zero_offset is not None) == ("symmetric" not in case)
    # int8 has one scale a row; int4 groups of 256 columns or a whole row become groups of 128 sharing scales
    assert layer.group_size == (0 if bits == 8 else min(128, 512 if group == -1 else group))


def test_the_packed_layouts_decode_field_by_field():
    """A word's fields in order, for both directions and the AWQ column order (negative words included)."""
    words = torch.tensor([[0x76543210, -0x789ABCDF - 1]], dtype=torch.int32)  # -0x789ABCE0 is 0x87654320
    assert packed.unpack(words, 4, 1).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 0, 2, 3, 4, 5, 6, 7, 8]]
    assert packed.unpack(words.T.contiguous(), 8, 0)[:, 0].tolist() == [0x10, 0x32, 0x54, 0x76, 0x20, 0x43, 0x65, 0x87]
    cols = np.arange(8)[None, :]
    assert packed.unpack(torch.from_numpy(qc.pack_columns(cols, 4, qc.AWQ_PACK)), 4, 1).tolist() == [
        [0, 2, 4, 6, 1, 3, 5, 7]]


def _bad_layer(change):
    t, _ = _layer_tensors(np.random.default_rng(1).standard_normal((16, 64)), "gptq")
    change(t)
    return t


@pytest.mark.parametrize("what, call, words", [
    ("8-bit in groups", lambda: packed.gptq("l", _layer_tensors(np.ones((16, 64)) * np.arange(64), "gptq", 8, 32)[0],
                                            8, 32, "gptq"), "8-bit values in groups of 32"),
    ("a group of 48", lambda: packed.gptq("l", _bad_layer(lambda t: None), 4, 48, "gptq"), "do not fit"),
    ("a group size the reader cannot split", lambda: packed.layer("l", torch.zeros(4, 48, dtype=torch.int64),
                                                                  torch.zeros(4, 1, dtype=torch.int64),
                                                                  torch.ones(4, 1), 4, 48, None, None, "gptq", 0),
     "groups of 48"),
    ("g_idx with unequal groups", lambda: packed.gptq("l", _bad_layer(
        lambda t: t.__setitem__("g_idx", torch.zeros(64, dtype=torch.int32).index_fill_(0, torch.tensor([5]), 1))),
        4, 32, "gptq"), "g_idx does not give"),
    ("no qzeros", lambda: packed.gptq("l", _bad_layer(lambda t: t.pop("qzeros")), 4, 32, "gptq"), "l.qzeros"),
    ("scales of another shape", lambda: packed.gptq("l", _bad_layer(lambda t: t.__setitem__(
        "scales", t["scales"][:, :8])), 4, 32, "gptq"), "do not fit"),
])
def test_a_layer_egraft_does_not_read_is_refused_naming_it(what, call, words):
    with pytest.raises(InputError, match=words):
        call()


def _checkpoint(tmp_path, family, method, **kw):
    model = tiny_family(family)
    path = str(tmp_path / f"{family}-{method}")
    meant = qc.write(model, path, method, **kw)
    return model, path, qc.float_model(model, meant)


@pytest.mark.parametrize("family, method, kw", [
    ("llama", "gptq", dict(act_order=True)), ("qwen2", "awq", {}),
    ("qwen3", "gptq", dict(sym=True, fmt="gptq_v2", group=-1)), ("llama", "gptq", dict(bits=8, group=-1)),
    ("gpt2", "gptq", {})])
def test_from_pretrained_is_the_checkpoints_dequantised_model(family, method, kw, tmp_path):
    import egraft

    _, path, want = _checkpoint(tmp_path, family, method, **kw)
    got = egraft.from_pretrained(path)
    layers = [m for m in got.modules() if isinstance(m, QuantizedLinear)]
    assert len(layers) == (8 if family == "gpt2" else 14) and {m.source for m in layers} == {method}
    ws = dict(want.named_modules())
    for name, m in got.named_modules():
        if isinstance(m, QuantizedLinear):
            w = ws[name].weight
            assert torch.equal(m.dequantized(), w.T if family == "gpt2" else w), name
    assert got.lm_head.weight.dtype == torch.float32  # the float16 tensors widened
    ids, mask = left_padded([6, 3], seed=21, vocab=VOCAB)
    assert torch.equal(reference(got, ids, mask, **KW), reference(want, ids, mask, **KW))


def _edit_config(path, **changes):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"].update(changes)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)


def _edit_tensors(path, change):
    from safetensors.torch import load_file, save_file

    file = os.path.join(path, "model.safetensors")
    t = load_file(file)
    change(t)
    save_file(t, file)


@pytest.mark.parametrize("what, change, words", [
    ("another method", lambda p: _edit_config(p, quant_method="bitsandbytes"), "egraft reads gptq and awq"),
    ("3-bit GPTQ", lambda p: _edit_config(p, bits=3), "4- and 8-bit GPTQ"),
    ("a GPTQ format egraft does not read", lambda p: _edit_config(p, checkpoint_format="marlin"), "'marlin'"),
    ("a tensor the model lacks", lambda p: _edit_tensors(p, lambda t: t.__setitem__("extra.weight", torch.ones(2))),
     "'extra.weight'"),
    ("a missing norm", lambda p: _edit_tensors(p, lambda t: t.pop("model.norm.weight")), "'model.norm.weight'"),
    ("a layer of the wrong width", lambda p: _edit_tensors(p, lambda t: t.update(
        {k: torch.cat([v, v], dim=-1) for k, v in t.items() if ".layers.0.mlp.up_proj." in k and "g_idx" not in k})),
     "up_proj"),
    ("no config.json", lambda p: os.remove(os.path.join(p, "config.json")), "no config.json"),
    ("a corrupt weights file", lambda p: open(os.path.join(p, "model.safetensors"), "wb").write(b"\x00" * 9),
     "not a readable safetensors file"),
])
def test_a_checkpoint_egraft_does_not_read_is_refused_naming_what_was_wrong(what, change, words, tmp_path):
    import egraft

    _, path, _ = _checkpoint(tmp_path, "llama", "gptq")
    change(path)
    with pytest.raises(InputError, match=words):
        egraft.from_pretrained(path)


def test_a_float_checkpoint_loads_through_transformers(tmp_path):
    import egraft

    model = tiny_family("qwen2")
    model.save_pretrained(str(tmp_path / "float"))
    got = egraft.from_pretrained(str(tmp_path / "float"))
    ids = torch.randint(2, VOCAB, (2, 5))
    with torch.no_grad():
        assert torch.equal(got(ids).logits, model(ids).logits)
    assert not any(isinstance(m, QuantizedLinear) for m in got.modules())


def test_the_cli_reads_a_checkpoint_directory(tmp_path):
    from egraft.cli.common import load_model

    _, path, _ = _checkpoint(tmp_path, "qwen2", "awq")
    model, example = load_model(path, need_inputs=False)
    assert example is None and sum(isinstance(m, QuantizedLinear) for m in model.modules()) == 14


@pytest.mark.parametrize("family, method, kw", [("llama", "gptq", dict(act_order=True)), ("qwen2", "awq", {}),
                                                 pytest.param("qwen2", "gptq", dict(bits=8, group=-1),
                                                              marks=pytest.mark.slow)])  # (8-bit's layout: above)
def test_a_gptq_or_awq_checkpoint_compiles_to_the_dequantised_models_tokens_and_loads(family, method, kw,
                                                                                      search_cache, tmp_path):
    import egraft

    _, path, want_model = _checkpoint(tmp_path, family, method, **kw)
    model = egraft.from_pretrained(path)
    cm = egraft.compile(model, device="cpu", backend="jax", budget="1s", max_batch=2, max_length=64, chunks=(1, 4),
                        contexts=(), cache=search_cache, progress=False)
    described = cm.generation.describe()["quantization"]
    bits = kw.get("bits", 4)
    assert described["source"] == method and described["mode"] == f"int{bits}" and described["layers"] == 14
    assert "zero points" in described["scheme"] and ("act-order" in described["scheme"]) == bool(kw.get("act_order"))
    with pytest.raises(InputError, match=f"quantised already \\({method}, 14 layers\\)"):
        egraft.compile(model, device="cpu", quantize="int8")
    ids, mask = left_padded([6, 3], seed=22, vocab=VOCAB)
    want = reference(want_model, ids, mask, **KW)
    assert torch.equal(cm.generate(ids, attention_mask=mask, **KW), want)
    loaded = egraft.load(cm.save(str(tmp_path / "art")))
    assert torch.equal(loaded.generate(ids, attention_mask=mask, **KW), want)


def test_from_pretrained_says_each_stage_when_asked_and_ends_its_line_on_an_error(tmp_path, capsys):
    import egraft

    _, path, _ = _checkpoint(tmp_path, "llama", "awq")
    egraft.from_pretrained(path, progress=True)
    lines = capsys.readouterr().err.splitlines()
    stages = [line for line in lines if line.startswith("egraft.from_pretrained:")]
    assert [s.split(": ")[1].split(" ")[0] for s in stages] == ["reading", "building", "decoding", "loading"]
    assert all(s.endswith(" s") for s in stages), stages
    _edit_tensors(path, lambda t: t.pop("model.norm.weight"))
    with pytest.raises(InputError):
        egraft.from_pretrained(path, progress=True)
    assert capsys.readouterr().err.endswith(" s\n")
