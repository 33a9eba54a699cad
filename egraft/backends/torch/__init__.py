"""The torch backend: an IR graph as a ``torch.fx`` module of ATen ops, run eagerly or compiled by Inductor.

Importing this package registers the backend as ``"torch"``; use it through
``egraft.backends.lower(graph, "torch", device, knobs)`` (``cpu`` or
``cuda``).  Lowering rules are in :mod:`.rules` (one per op, each emitting
``torch.ops.aten.*`` calls), views become ATen movement ops in :mod:`.views`,
exact dtype conversions and the FX graph under construction are in
:mod:`.emit`, :mod:`.program` builds the module, and :mod:`.executable` binds
the weights on the device once and runs it (knob ``mode``: ``"eager"`` or
``"inductor"``).
"""

from __future__ import annotations

from ..base import Backend, register
from ..xla_fusion import plan
from .executable import COPY_FREE, KNOBS, TorchExecutable, knobs, lower
from .rules import RULES


def rule_table():
    return RULES


# mode=inductor is a late knob: each new value is a compile of many seconds on one core, tried once on the winner
BACKEND = register(Backend(name="torch", devices={"cpu": 10, "cuda": 10}, lower=lower, knobs=knobs,
                           rule_table=rule_table, plan=plan, late_knobs={"mode": "inductor"}, state_in_place=True,
                           writer="egraft.backends.torch.export", loader="egraft.runtime.torch_loader",
                           copy_free=COPY_FREE))

__all__ = ["BACKEND", "KNOBS", "RULES", "TorchExecutable", "knobs", "lower", "rule_table"]
