"""The JAX/XLA backend: an IR graph as one jitted JAX function (CPU, GPU, TPU).

Importing this package registers the backend as ``"jax"``; use it through
``egraft.backends.lower(graph, "jax", device, knobs)``.  Lowering rules are
in :mod:`.rules` (one per op), views become XLA movement ops in
:mod:`.views`, primitive matmul / index_select / pad-and-cat patterns become
library ops in :mod:`.peephole` (sliding-window convolution and pooling:
``conv_general_dilated`` / ``reduce_window``, in :mod:`.windows`), :mod:`.program` traces a graph into one
function, :mod:`.executable` binds weights on the device and runs it, and
:mod:`.export` writes StableHLO for cpu/cuda/tpu (``egraft.runtime`` loads it).
"""

from __future__ import annotations

from ..base import Backend, register
from ..xla_fusion import plan
from .executable import COPY_FREE, KNOBS, JaxExecutable, knobs, lower
from .export import export_executable
from .rules import RULES


def rule_table():
    return RULES


BACKEND = register(Backend(name="jax", devices={"cpu": 20, "cuda": 20, "tpu": 20}, lower=lower, knobs=knobs,
                           rule_table=rule_table, plan=plan, writer="egraft.backends.jax.export",
                           loader="egraft.runtime.jax_loader", copy_free=COPY_FREE,
                           copy_free_only=("stream_layout",)))

__all__ = ["BACKEND", "KNOBS", "JaxExecutable", "RULES", "export_executable", "knobs", "lower", "rule_table"]
