"""A compiled or a loaded step as the generation runtime's program: the one adapter.

Both an executable ``egraft.compile`` made and an artifact ``egraft.load``
read hold a *runner* (``JaxRunner``, ``TorchRunner`` or ``TritonRunner``)
and the step's state calling convention: each cache is an input of the
step, and one output holds its new value (the output *aliased* to it); the
one output left over is the logits.  :func:`step_program` turns that into
the program ``runtime.step_spec`` describes::

    logits, new_state = program(input_ids, position_ids, slot_mask, *state)

A JAX step keeps its caches as jax arrays donated to each call
(:func:`jax_step_program`); the others call the runner's ``run_torch``.
The per-step inputs go to the runner without the executable's checks: the
Engine builds them to the spec and ``step_spec.check_state`` checked the
caches.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..errors import InputError
from .step_spec import StepProgram


def state_outputs(aliases: Mapping[str, int], n_outputs: int, names: Sequence[str]) -> tuple[list[int], list[int]]:
    """The state calling convention, read once for every caller (a step, a model's buffers, a Dynamo graph's
    written inputs): the output holding each state's new value, in `names`' order, and the program's own
    outputs (the others, in order).  `aliases`: a state input's name -> the output aliased to it; InputError
    when a state has none."""
    missing = [n for n in names if n not in aliases]
    if missing:
        raise InputError(f"the state input {missing[0]!r} has no output aliased to it (each state's new value is "
                         "the output aliased to its input)")
    order = [int(aliases[n]) for n in names]
    taken = set(order)
    return order, [k for k in range(n_outputs) if k not in taken]


def graph_state(graph, names: Sequence[str] | None = None) -> tuple[list[str], list[int], list[int]]:
    """:func:`state_outputs` of an IR graph: its state names (`names`, default the graph's state inputs in
    call order), each one's aliased output, and the graph's own outputs."""
    names = list(graph.state_names() if names is None else names)
    order, own = state_outputs({name: k for k, name in graph.aliases.items()}, len(graph.outputs), names)
    return names, order, own


def state_order(aliases: Mapping[str, int], n_outputs: int, names: Sequence[str]) -> tuple[list[int], int]:
    """A step's :func:`state_outputs`: each cache's output and the logits' output (InputError unless one)."""
    order, own = state_outputs(aliases, n_outputs, names)
    if len(own) != 1:
        raise InputError(f"the step program has {len(own)} outputs besides its state; a step returns the logits alone")
    return order, own[0]


def step_program(runner, aliases: Mapping[str, int], n_outputs: int, names: Sequence[str]) -> StepProgram:
    """`runner`'s program as the generation runtime's (module docstring)."""
    order, logit = state_order(aliases, n_outputs, names)
    if type(runner).__name__ == "JaxRunner" and runner.state_outputs:
        return jax_step_program(runner, order, logit)
    run = runner.run_torch

    def program(input_ids, position_ids, slot_mask, *state):
        outs = run([input_ids, position_ids, slot_mask, *state])
        return outs[logit], [outs[k] for k in order]

    return program


def jax_step_program(runner, order: list[int], logit: int) -> StepProgram:
    """A JAX step keeping the caches as jax arrays on its device, donated to each call (updated in place, no copy
    per step); the one call path of a compiled and a loaded JAX step, on every device.

    torch caches (fresh ones) go in once (on the CPU as zero-copy numpy
    views, which the call copies into its own buffers; elsewhere copied to
    the device); the jax arrays it returns are the caches from then on (the
    Engine keeps them).  A bfloat16 or float16 cache is held as its bits
    (``int16`` jax arrays: ``backends.jax.function.program_dtype`` says why).  Tokens below the vocabulary and positions below the
    cache length fit int32 when the program takes int64 as int32.  The
    logits come back as a torch tensor on the program's device (on a GPU the
    XLA buffer itself, through DLPack), so sampling runs where they are and
    only the chosen tokens cross to the host.
    """
    import jax
    import numpy as np
    import torch

    from ..ir.tensors import view_numpy, view_torch
    from .jax_runner import STATE_BITS

    ids_dt, pos_dt, mask_dt = runner.program_dtypes[:3]
    on_cpu, dev = runner.on_cpu, runner.dev
    state_dts = runner.program_dtypes[3:]  # a half-type cache: its bits, int16 (jax_runner.STATE_BITS)

    def put(a: np.ndarray):
        return a if on_cpu else jax.device_put(a, dev)

    def as_input(x, dt):
        if isinstance(x, jax.Array):  # a cache a call returned; reinterpreted if another program's (rare)
            return x if x.dtype == dt else jax.lax.bitcast_convert_type(x, dt)
        x = x.detach().cpu()
        return put(x.view(torch.int16).numpy() if dt == STATE_BITS else view_numpy(x))

    def small(x, dt):
        return put(np.asarray(x.cpu().numpy() if isinstance(x, torch.Tensor) else x).astype(dt, copy=False))

    def logits_of(o):
        return view_torch(np.array(o)) if on_cpu else torch.from_dlpack(o)

    def program(input_ids, position_ids, slot_mask, *state):
        outs = runner.call([small(input_ids, ids_dt), small(position_ids, pos_dt), small(slot_mask, mask_dt),
                            *map(as_input, state, state_dts)])
        return logits_of(outs[logit]), [outs[k] for k in order]

    return program


__all__ = ["graph_state", "jax_step_program", "state_order", "state_outputs", "step_program"]
