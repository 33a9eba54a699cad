"""``egraft compile module:factory --generate ...`` writes a generation that ``egraft.load`` runs: transformers'
tokens, greedy and seeded sampling."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from compiled_helpers import MAX_BATCH, MAX_LENGTH, ROOT, left_padded, reference

import egraft
from egraft.runtime.generation_artifact import GenerationArtifact

FACTORY = f"""
import sys
sys.path.insert(0, {str(ROOT / "tests" / "generation")!r})
from compiled_helpers import tiny


def build():
    return tiny("gpt2")
"""


def test_cli_compile_generate_then_load(compiled_of, search_cache, tmp_path):
    # the same model compiled here first: the CLI reads its cache entry (its own ladder 1, 4, 64 has the same largest
    # chunk, hence the same cache length and decode step, as this run's 1, 4, 16, 64)
    model, _ = compiled_of("gpt2", "auto")
    chunks = (1, 4, 64)
    (tmp_path / "tinygen_factory.py").write_text(FACTORY)
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "egraft.cli", "compile", "tinygen_factory:build", "--generate",
           "--max-batch", str(MAX_BATCH), "--max-length", str(MAX_LENGTH), "--chunks", ",".join(map(str, chunks)),
           "--budget", "1s", "-o", str(out)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{tmp_path}", "EGRAFT_CACHE_DIR": str(search_cache.root),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    art = egraft.load(str(out))
    programs = len(chunks) * (1 + len(art.spec.rows))  # max_length 128: no context bucket; the full rows and one
    assert art.spec.contexts == () and art.spec.rows == (1,) and len(art.steps) == programs
    assert f"generation: {programs} step programs" in done.stdout and "1 searched" in done.stdout, done.stdout
    assert isinstance(art, GenerationArtifact)
    assert list(art.spec.chunks) == list(chunks) and art.spec.max_batch == MAX_BATCH
    ids, mask = left_padded([3, 17, 60], seed=60)
    kw = dict(max_new_tokens=64, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(art.generate(ids, mask, **kw), reference(model, ids, mask, **kw))
    kw = dict(max_new_tokens=40, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, eos_token_id=None,
              pad_token_id=0)
    torch.manual_seed(3)
    want = reference(model, ids, mask, **kw)
    torch.manual_seed(3)
    assert torch.equal(art.generate(ids, mask, **kw), want)


def test_generation_flags_parse_chunks_and_contexts():
    import argparse

    import pytest

    from egraft.cli.compile import generation_flags
    from egraft.errors import EgraftError

    def ns(**kw):
        base = dict(generate=True, max_batch=2, max_length=64, chunks=None, contexts=None, rows=None)
        return argparse.Namespace(**{**base, **kw})

    assert generation_flags(ns(chunks="1,4", contexts="16,32", rows="1")) == {
        "max_batch": 2, "max_length": 64, "chunks": (1, 4), "contexts": (16, 32), "rows": (1,)}
    assert generation_flags(ns(contexts=""))["contexts"] == ()  # no decode context buckets
    assert generation_flags(ns())["contexts"] is None  # the default buckets
    with pytest.raises(EgraftError, match="--contexts"):
        generation_flags(ns(contexts="16,x"))
    with pytest.raises(EgraftError, match="add --generate"):
        generation_flags(ns(generate=False, max_batch=None, max_length=None, contexts="16"))
