"""An artifact as one torch custom op, so torch.compile / Dynamo / torch.export see a single node.

``register(artifact, name)`` defines ``torch.ops.egraft.<name>`` with
``torch.library.custom_op``: its schema takes the artifact's inputs (one
``Tensor`` each, named after them) and returns its flat outputs (one
``Tensor``, or a tuple of them in the manifest's output order; rebuild the
model's structure with ``egraft.runtime.outputs.rebuild(artifact.output_tree,
list(result))``).  The fake (meta) implementation returns empty tensors of
the manifest's output shapes and dtypes, so tracing never runs the program.
The op is inference only: no autograd formula is registered.

Names: by default the artifact's model name plus a hash of its program and
weights, so two different artifacts never share an op.  torch cannot
redefine an op in a process; registering a name again with the same schema
rebinds the op to the newer artifact (a reload), with another schema it is
an ``ArtifactError``.
"""

from __future__ import annotations

import hashlib
import keyword
import re
import threading

from ..errors import ArtifactError
from ..ir.tensors import torch_dtype

NAMESPACE = "egraft"
_REGISTERED: dict[str, tuple[str, list, object]] = {}  # name -> (schema, [artifact], op)
_LOCK = threading.Lock()


def _ident(s: str, fallback: str) -> str:
    s = re.sub(r"\W", "_", str(s)).strip("_").lower()
    if not s or s[0].isdigit() or keyword.iskeyword(s):
        s = f"{fallback}_{s}" if s else fallback
    return s


def default_name(artifact) -> str:
    """``<model>_<hash>``: the hash covers the program files and the weights, by their recorded SHA-256."""
    files = artifact.manifest.get("files", {})
    digest = hashlib.sha256("".join(f"{k}={files[k]};" for k in sorted(files)).encode()).hexdigest()[:10]
    return f"{_ident(artifact.name, 'model')[:40]}_{digest}"


def schema_of(artifact) -> str:
    names, taken = [], set()
    for k, spec in enumerate(artifact.input_specs):
        n = _ident(spec.name, f"x{k}")
        if n in taken or n in ("self", "out"):
            n = f"x{k}_{n}"
        taken.add(n)
        names.append(n)
    n_out = len(artifact.output_specs)
    ret = "Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"
    return "(" + ", ".join(f"Tensor {n}" for n in names) + f") -> {ret}"


def register(artifact, name: str | None = None):
    """Define (or rebind) ``torch.ops.egraft.<name>`` for `artifact`; returns the op (callable)."""
    import torch

    name = name or default_name(artifact)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ArtifactError(f"op name {name!r} is not an identifier; use letters, digits and underscores")
    schema = schema_of(artifact)
    with _LOCK:
        if name in _REGISTERED:
            old_schema, holder, op = _REGISTERED[name]
            if old_schema != schema:
                raise ArtifactError(f"torch.ops.{NAMESPACE}.{name} is already defined in this process as "
                                    f"{old_schema}; this artifact needs {schema}: pass another name")
            holder[0] = artifact
            return op
        if hasattr(getattr(torch.ops, NAMESPACE), name):
            raise ArtifactError(f"torch.ops.{NAMESPACE}.{name} was defined outside egraft.runtime; pass another name")
        holder = [artifact]
        single = len(artifact.output_specs) == 1
        specs = [(tuple(o.shape), torch_dtype(o.dtype)) for o in artifact.output_specs]

        def run(*xs):
            flat = holder[0].run_flat(*xs)
            return flat[0] if single else tuple(flat)

        def fake(*xs):
            dev = xs[0].device if xs else torch.device(str(holder[0].device))
            outs = [torch.empty(s, dtype=d, device=dev) for s, d in specs]
            return outs[0] if single else tuple(outs)

        op = torch.library.custom_op(f"{NAMESPACE}::{name}", run, mutates_args=(), schema=schema)
        op.register_fake(fake)
        _REGISTERED[name] = (schema, holder, op)
        return op


__all__ = ["NAMESPACE", "default_name", "register", "schema_of"]
