"""A JAX step off the CPU takes the same path as on it: caches kept as jax arrays on the program's device and
donated, per-step inputs put on the device, logits back as a torch tensor through DLPack.

This machine has no GPU, so the path a GPU program takes is run on the CPU
device: the runner is wrapped to say it is not on the CPU (``on_cpu`` is
the only thing the step program reads to choose), which sends every input
through ``jax.device_put`` and the logits through DLPack.  Tokens must equal
transformers' and the caches must stay the step's own jax arrays.
"""

from __future__ import annotations

import jax
from compiled_helpers import compile_tiny, left_padded, reference

from egraft.runtime.generation import StepPrograms, generate, new_state
from egraft.runtime.step_program import jax_step_program

KW = dict(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)


class _OffCpu:
    """A JAX runner that says it is not on the CPU (what a runner on a GPU says); everything else is the runner's."""

    on_cpu = False

    def __init__(self, runner):
        self._runner = runner

    def __getattr__(self, name):
        return getattr(self._runner, name)


def test_the_device_path_gives_transformers_tokens_and_keeps_the_caches_on_the_device(search_cache):
    model, cm = compile_tiny("llama", "jax", search_cache, max_batch=2, max_length=64, chunks=(1, 4), contexts=())
    g = cm.generation
    names = [s.name for s in g.spec.state]
    programs = {}
    for b, p in g.programs.items():
        exe = p.executable
        by_name = {n: k for k, n in exe.graph.aliases.items()}
        order = [by_name[n] for n in names]
        logit = next(k for k in range(len(exe.graph.outputs)) if k not in exe.graph.aliases)
        programs[b] = jax_step_program(_OffCpu(exe.runner), order, logit)
    steps = StepPrograms(g.spec, programs)
    ids, mask = left_padded([5, 3], seed=11)
    want = reference(model, ids, mask, **KW)
    state = new_state(g.spec)
    got = generate(steps, state, ids, mask, **KW)
    assert got.tolist() == want.tolist()
    assert all(isinstance(x, jax.Array) for x in state)  # the step's own arrays from the first call on
    first = [x.unsafe_buffer_pointer() for x in state]
    again = generate(steps, state, ids, mask, **KW)  # a second request over the same caches
    assert again.tolist() == want.tolist()
    assert [x.unsafe_buffer_pointer() for x in state] == first  # donated and written in place, not copied
