"""Extracted programs of every reference model, run through every backend.

What a user hits after ``saturate`` + ``Space``: for every workload of
``egraft.models`` and the three ``transformers`` models (GPT-2, Llama, BERT)
at tiny sizes, one bounded saturation (shared by the backends), then the
greedy extraction and ``N_SAMPLES`` sampled extractions are lowered with JAX,
with Triton (the interpreter on CPU) and with torch (eager ATen ops on the
CPU) and compared with ``ir.evaluate`` of the ORIGINAL traced graph on the
same random inputs.

The attention workloads are also extracted with a cost that makes every
``Attention`` e-node cheap, so the program holds the idiom and each backend's
attention rule (Triton's attention kernel, JAX's and torch's attention rules) runs: the
causal mask and the bias/mask input are checked there, not only in the
primitive form the front end writes.

Every run draws a seed from ``fresh_seed()`` (printed, and in each failure
message); ``EGRAFT_SEED=<n>`` replays it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from triton_helpers import DEVICE, require_mode

import egraft
from egraft.backends import NAMES as BACKEND_NAMES, lower
from egraft.ir import Graph, evaluate
from egraft.ir import dtypes
from egraft.models import MODELS, hf
from egraft.rewrites import Limits, saturate
from egraft.search import Space
from egraft.search.space import default_cost
from egraft.testing import assert_close, fresh_seed, random_inputs, rel_err

N_SAMPLES = 3
BATCH, SEQ = 1, 4
LIMITS = Limits(iterations=6, nodes=4_000, seconds=20.0)
VOCAB = 97

# factory overrides that shrink each workload's "tiny" preset to hidden <= 16 (Triton's interpreter is slow)
SMALL = {
    "mlp": dict(d=8, hidden=16),
    "gpt2_block": dict(hidden=16, heads=2),
    "gpt2_stack": dict(hidden=16, heads=2),
    "llama_block": dict(hidden=16, heads=2, kv_heads=1, intermediate=32),
    "resnet_block": dict(in_channels=2, out_channels=4),
    "rmsnorm_linear": dict(hidden=16, out=8),
    "lora_linear": dict(hidden=16, out=8, rank=2),
    "gated_mlp": dict(hidden=16, intermediate=32),
    "gqa_attention": dict(hidden=16, heads=2, kv_heads=1),
    "qknorm_attention": dict(hidden=16, heads=2, kv_heads=1),
    "mask_attention": dict(hidden=16, heads=2, kv_heads=1),
    "mask_attention_additive": dict(hidden=16, heads=2, kv_heads=1),
}
HF = ("hf_gpt2", "hf_llama", "hf_bert")
NAMES = sorted(MODELS) + list(HF)
BACKENDS = BACKEND_NAMES  # every backend of egraft
# attention workloads -> (causal, has a bias operand) of the Attention node they must extract to
ATTENTION = {"gqa_attention": (True, False), "mask_attention": (False, True),
             "mask_attention_additive": (False, True)}


def test_every_workload_is_covered():
    assert set(SMALL) == set(MODELS), "give each new workload a small size in SMALL"


@dataclass
class Case:
    name: str
    seed: int
    graph: Graph  # the traced graph
    space: Space
    inputs: list  # numpy, one per graph input
    want: list  # evaluate(graph, inputs)
    candidates: dict  # label -> extracted Graph


def _model(name: str, seed: int):
    if name in HF:
        model, kwargs = hf.build(name[3:], layers=2, hidden=16, heads=2, kv_heads=1, vocab=VOCAB, positions=8,
                                 seed=seed)
        ids = torch.from_numpy(np.random.default_rng(seed).integers(0, VOCAB, size=(BATCH, SEQ)))
        return model, (ids,), kwargs
    spec = MODELS[name]
    model = spec.build("tiny", seed=seed, **SMALL[name])
    return model, spec.example_inputs(model, batch=BATCH, seq=SEQ, seed=seed), None


@functools.cache
def case(name: str) -> Case:
    """Trace, saturate once and extract (greedy + samples); shared by every test of `name`."""
    seed = fresh_seed()
    print(f"{name}: seed {seed} (EGRAFT_SEED={seed} replays it)")
    model, args, kwargs = _model(name, seed % 1000)
    g = egraft.trace(model, args, kwargs)
    # float inputs are random; token ids and boolean masks keep the model's own (valid) values
    xs = [x if dtypes.is_float(dt) else a.numpy()
          for x, a, (_, dt) in zip(random_inputs(g, seed), args, g.input_types())]
    sp = Space.from_egraph(saturate(g, limits=LIMITS))
    rng = np.random.default_rng(seed)
    cands = {"greedy": sp.greedy(), **{f"sample {k}": sp.sample(rng) for k in range(N_SAMPLES)}}
    return Case(name, seed, g, sp, xs, evaluate(g, xs), cands)


def _run(c: Case, label: str, prog: Graph, backend: str):
    """Lower `prog` with `backend`, run it on the case's inputs, compare with the original graph."""
    if backend == "triton":
        require_mode()
    ex = lower(prog, backend, DEVICE if backend == "triton" else "cpu")
    got = [np.asarray(o.cpu() if isinstance(o, torch.Tensor) else o) for o in ex(*c.inputs)]
    what = f"{c.name}, {label} extraction on {backend} (seed {c.seed})"
    try:
        assert_close(got, c.want, [d for _, d in c.graph.output_types()], what=what)
    except AssertionError as e:
        # which side is wrong: the extraction itself (a rewrite) or the backend?
        ref = evaluate(prog, c.inputs)
        errs = ", ".join(f"{rel_err(a, b):.3g}" for a, b in zip(ref, c.want))
        raise AssertionError(f"{e}\nevaluate(extraction) vs evaluate(original): rel err {errs}"
                             f"\n--- extraction ---\n{prog.dump()}") from None
    return ex


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_extractions_match_the_traced_graph(name, backend):
    c = case(name)
    for label, prog in c.candidates.items():
        _run(c, label, prog, backend)


def _attention_cheap(node, space):
    return 1e-6 if node.op == "Attention" else default_cost(node, space)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_attention_extraction_uses_the_attention_rule(name, backend):
    c = case(name)
    causal, bias = ATTENTION[name]
    prog = c.space.greedy(_attention_cheap)
    att = [n for n in prog.nodes if n.op == "Attention"]
    assert att, f"{name}: no Attention e-node reached the extraction (seed {c.seed})"
    for n in att:
        assert n.attrs["causal"] == causal and (len(n.inputs) == 4) == bias, (
            f"{name}: Attention(causal={n.attrs['causal']}, {len(n.inputs)} operands), expected causal={causal}, "
            f"bias={bias} (seed {c.seed})")
    ex = _run(c, "attention-preferring", prog, backend)
    if backend == "triton":
        kinds = [k.kind for k in ex.kernels]
        assert kinds.count("attention") == len(att), f"{name}: kernels {kinds} (seed {c.seed})"
