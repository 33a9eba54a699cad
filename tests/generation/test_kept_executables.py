"""A saved generation with its executables kept: a fresh process loads each JAX CPU step from what XLA compiled
at save time (runtime.bundled) and gives transformers' tokens."""

from __future__ import annotations

import json
import os

from compiled_helpers import left_padded, reference, run_python

from egraft.runtime import bundled

GREEDY = dict(max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)

SCRIPT = """
import json, sys
import torch
torch.set_num_threads(1)
import egraft
art = egraft.load(sys.argv[1] if len(sys.argv) > 1 else %r)
ids, mask = (torch.tensor(v) for v in json.loads(%r))
tokens = art.generate(ids, mask, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0).tolist()
print(json.dumps({"tokens": tokens, "loaded": {str(b): getattr(a.runner, "loaded", None)
                                                for b, a in art.steps.items()}}))
"""


def test_a_fresh_process_loads_the_kept_steps_and_gives_transformers_tokens(compiled_of, tmp_path):
    model, cm = compiled_of("llama", "auto")
    directory = cm.save(tmp_path / "llama", keep_executables=True)
    kept = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name, "manifest.json")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            m = json.load(f)
        if m["target"]["backend"] == "jax":
            entry = m["kernels"][0]["executable"]
            assert entry["host"] == bundled.host() and bundled.EXECUTABLE_FILE in m["files"], name
            kept.append(name)
    assert kept, "no step of the tiny Llama was compiled for the JAX backend: nothing to keep"
    ids, mask = left_padded([5, 19], seed=77)
    got = run_python(SCRIPT % (str(directory), json.dumps([ids.tolist(), mask.tolist()])))
    assert got["tokens"] == reference(model, ids, mask, **GREEDY).tolist()
    jax_steps = [v for v in got["loaded"].values() if v is not None]
    assert len(jax_steps) == len(kept) and set(jax_steps) == {"the executable kept in the artifact"}, got["loaded"]
