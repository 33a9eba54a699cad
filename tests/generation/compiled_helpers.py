"""Tiny seeded GPT-2 / Llama causal LMs compiled with egraft for generation, and what the compiled tests share.

Every compile goes to one search cache in a temporary directory (the
package-scoped ``search_cache`` fixture), never the user's: a test that
reads a cache hit (a second process, the CLI) reads the hit the first
compile in this run wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
MAX_BATCH, MAX_LENGTH, CHUNKS = 4, 128, (1, 4, 16, 64)
CONTEXTS = (32,)  # one context bucket: decode below 32 slots, and the prompt chunks of 4 and 16 tokens
EOS, SEED = 1, 1234
HEAVY = ("transformers", "egglog", "deap")


def tiny(family: str, max_positions: int = 128):
    """The tiny model of `family` (seeded, eval mode), built the same in every process (`max_positions`: GPT-2's
    n_positions; Llama's default 2048 covers every test)."""
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        if family == "gpt2":
            model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=97,
                                               n_positions=max_positions, bos_token_id=0, eos_token_id=EOS))
        else:
            model = LlamaForCausalLM(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                                 num_hidden_layers=2, intermediate_size=128, vocab_size=97,
                                                 bos_token_id=0, eos_token_id=EOS))
    return model.eval()


def compile_tiny(family: str, backend: str, cache, *, max_batch=MAX_BATCH, max_length=MAX_LENGTH, chunks=CHUNKS,
                 contexts=CONTEXTS):
    """(model, CompiledModel) of the tiny `family` model compiled for generation, budget 1 s."""
    import egraft

    model = tiny(family, max_positions=max(128, max_length))
    cm = egraft.compile(model, device="cpu", backend=backend, budget="1s", max_batch=max_batch,
                        max_length=max_length, chunks=chunks, contexts=contexts, cache=cache, progress=False)
    return model, cm


def reference(model, ids, mask=None, **kw):
    """transformers' own generate."""
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, **kw)


def left_padded(lengths, seed: int, pad: int = 0, vocab: int = 97):
    """A left-padded batch of random prompts (tokens 2..vocab-1) with its attention mask."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(2, vocab, (len(lengths), width), generator=g)
    mask = torch.zeros(len(lengths), width, dtype=torch.int64)
    for i, n in enumerate(lengths):
        mask[i, width - n:] = 1
        ids[i, :width - n] = pad
    return ids, mask


def run_python(code: str, env: dict | None = None, cwd=None, timeout: int = 300, path: str | None = None) -> dict:
    """Run `code` in a fresh interpreter with this worktree (and `path`) on PYTHONPATH; the JSON its last stdout
    line prints."""
    pythonpath = os.pathsep.join([str(ROOT)] + ([str(path)] if path else []))
    full = {**os.environ, **(env or {}), "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=cwd,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
