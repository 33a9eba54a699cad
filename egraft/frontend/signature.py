"""The :class:`~egraft.ir.signature.Signature` of an exported program, and the one check that refuses state.

:func:`program_signature` reads ``torch.export``'s graph signature:

* the model's tensor inputs -> role ``input``, named as the tracer names
  their ``Input`` nodes (the exported placeholder's name, with ``_`` added
  while the name is taken by a weight or an earlier input), each with its
  ``source``: the keyword it was passed by (``mask``, or ``batch['x']``
  inside a container), or for a positional argument the placeholder name
  torch.export takes from the forward's parameter;
* parameters and buffers -> role ``weight``, named by their state_dict FQN;
* a buffer or input the forward pass writes (``BUFFER_MUTATION`` /
  ``USER_INPUT_MUTATION`` outputs) -> role ``state``, with the output that
  carries its new value aliased to it;
* lifted tensor constants and python values are not inputs (they are baked
  into the graph).

Outputs are the exported outputs with a tensor value, in export order (the
state updates first, then the model's own outputs).  The tracer lowers
state as ``Input`` nodes of role ``state``; :func:`require_pure` is the one
refusal for a caller that cannot hand state back (the ``torch.compile``
backend's padded buckets and split pieces).
"""

from __future__ import annotations

import torch

from ..errors import InputError, UnsupportedOpError
from ..ir import dtypes
from ..ir.signature import InputSpec, OutputSpec, Signature


def program_signature(ep: torch.export.ExportedProgram) -> Signature:
    """The signature of `ep` (module docstring); UnsupportedOpError for an input kind egraft cannot take."""
    return input_specs(ep)[0]


def input_specs(ep: torch.export.ExportedProgram, meta=None) -> tuple[Signature, dict[str, InputSpec]]:
    """The signature and each tensor placeholder's spec, by placeholder name (what the tracer binds).

    `meta`: node -> its value (default ``node.meta['val']``; the tracer passes
    :meth:`~egraft.frontend.sizes.SizeBinding.meta` for a program with symbolic sizes)."""
    from torch.export.graph_signature import InputKind, OutputKind

    meta = meta or (lambda node: node.meta.get("val"))

    gs = ep.graph_signature
    # a buffer's FQN and a user input's placeholder name may coincide (buffer "k", input "k"): kept apart
    mutated_buffers = {s.target for s in gs.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
    mutated_inputs = {s.target for s in gs.output_specs if s.kind == OutputKind.USER_INPUT_MUTATION}
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    user_names = _user_names(ep)
    taken = {s.target for s in gs.input_specs if s.kind in (InputKind.PARAMETER, InputKind.BUFFER)}
    calls, bound, by_node = [], [], {}
    n_user = 0
    for node, spec in zip(placeholders, gs.input_specs):
        kind = spec.kind
        val = meta(node)
        if kind in (InputKind.PARAMETER, InputKind.BUFFER):
            role = "state" if spec.target in mutated_buffers else "weight"
            s = InputSpec(spec.target, role, tuple(int(n) for n in val.shape), _dtype(val, f"weight {spec.target!r}"))
            bound.append(s)
        elif kind == InputKind.CONSTANT_TENSOR:
            continue
        elif kind == InputKind.USER_INPUT:
            source = user_names[n_user] if n_user < len(user_names) else node.name
            n_user += 1
            if not isinstance(val, torch.Tensor):
                continue  # a python value: baked in by export
            name = node.name
            while name in taken:
                name = name + "_"
            taken.add(name)
            role = "state" if node.name in mutated_inputs else "input"
            s = InputSpec(name, role, tuple(int(n) for n in val.shape), _dtype(val, f"input {source!r}"), source)
            calls.append(s)
        else:
            raise UnsupportedOpError(f"exported input of kind {kind.name} ({node.name})", None,
                                     "egraft lowers models whose inputs are tensors, parameters and buffers only")
        by_node[node.name] = s
    outs, aliases = [], []
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    for spec, arg in zip(gs.output_specs, out_node.args[0]):
        val = meta(arg) if isinstance(arg, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            continue
        if spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION):
            target = spec.target if spec.kind == OutputKind.BUFFER_MUTATION else by_node[spec.target].name
            aliases.append((len(outs), target))
        outs.append(OutputSpec(tuple(int(n) for n in val.shape), dtypes.from_torch(val.dtype)))
    return Signature(tuple(calls + bound), tuple(outs), tuple(aliases)), by_node


def _dtype(val: torch.Tensor, what: str) -> str:
    name = str(val.dtype).removeprefix("torch.")
    if name not in dtypes.DTYPES:
        raise InputError(f"{what} has dtype {val.dtype}; egraft supports {', '.join(dtypes.DTYPES)}")
    return name


def _user_names(ep) -> list[str]:
    """The user's own name for each user input of `ep`, in order: a kwarg's key, else the placeholder's name."""
    import torch.utils._pytree as pytree

    placeholders = [n.name for n, s in zip((n for n in ep.graph.nodes if n.op == "placeholder"),
                                           ep.graph_signature.input_specs) if s.kind.name == "USER_INPUT"]
    spec = ep.call_spec.in_spec
    if spec is None or spec.num_leaves != len(placeholders):  # pragma: no cover - torch invariant
        return placeholders
    paths = [p for p, _ in pytree.tree_flatten_with_path(pytree.tree_unflatten([0] * spec.num_leaves, spec))[0]]
    names = []
    for path, ph in zip(paths, placeholders):
        if len(path) >= 2 and getattr(path[0], "idx", None) == 1 and hasattr(path[1], "key"):
            names.append(str(path[1].key) + pytree.keystr(path[2:]))
        else:
            names.append(ph)
    return names


def require_pure(sig: Signature) -> None:
    """UnsupportedOpError naming each in-place update, for a caller that cannot write state back.

    ``egraft.trace`` and ``egraft.compile`` take state (role ``state``), and
    so does the ``torch.compile`` backend for a whole graph that writes its
    inputs; its padded buckets and split pieces cannot hand state back and
    call this.
    """
    if not sig.aliases:
        return
    what = ", ".join(f"{'input' if sig[name].source is not None else 'buffer'} '{name}'" for _, name in sig.aliases)
    raise UnsupportedOpError(
        f"in-place update of {what} inside a torch.compile graph", None,
        "the torch.compile backend writes state back only for a whole graph of fixed shapes (PyTorch runs this "
        "one); "
        "egraft.compile(model) compiles models that update buffers or inputs in place")


__all__ = ["input_specs", "program_signature", "require_pure"]
