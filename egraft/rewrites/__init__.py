"""Rewrites: encode an IR graph into an egglog e-graph and grow it under limits.

``saturate(graph, rules=None, limits=None) -> SaturationResult``; ``RULES`` is
every registered rule (``all_rules(families=..., explosive=...)`` selects).

Modules: :mod:`.schema` (the term language, generated from ``egraft.ir.OPS``),
:mod:`.codec` (graph <-> egglog text), :mod:`.rule` (what rule authors
import), :mod:`.rules` (the rule families), :mod:`.registry`, :mod:`.session`
(the egglog engine and its limits), :mod:`.saturate` (plain or layered),
:mod:`.blocks` / :mod:`.layers` / :mod:`.stitch` (repeated layers),
:mod:`.export` (egglog -> Snapshot), :mod:`.inspection`.
"""

from .ruleset import all_rules
from .rule import RuleSpec, Term, Witness
from .saturate import saturate
from .session import Limits, SaturationResult

__all__ = ["Limits", "RULES", "RuleSpec", "SaturationResult", "Term", "Witness", "all_rules", "saturate"]


def __getattr__(name):
    if name == "RULES":
        return all_rules()
    raise AttributeError(name)
