"""Rewrites: encode an IR graph into an egglog e-graph and grow it under limits.

``saturate(graph, rules=None, limits=None) -> SaturationResult``; ``RULES`` is
every registered rule (``all_rules(families=..., explosive=...)`` selects).

Modules: :mod:`.schema` (the term language, generated from ``egraft.ir.OPS``),
:mod:`.codec` (graph <-> egglog text), :mod:`.rule` (what rule authors
import), :mod:`.rules` (the rule families), :mod:`.registry`, :mod:`.session`
(the egglog engine and its limits), :mod:`.saturation` (plain or layered),
:mod:`.blocks` / :mod:`.layers` / :mod:`.stitch` (repeated layers),
:mod:`.export` (egglog -> Snapshot), :mod:`.inspection`.
"""

from .ruleset import all_rules
from .rule import RuleSpec, Term, Witness

__all__ = ["Limits", "RULES", "RuleSpec", "SaturationResult", "Term", "Witness", "all_rules", "saturate"]


def __getattr__(name):
    # the engine's names import egglog (a second or more): loaded on first use, so that reading the rules (a cached
    # compile hashes them for its key) does not pay for it
    if name == "RULES":
        return all_rules()
    if name == "saturate":
        from .saturation import saturate

        return saturate
    if name in ("Limits", "SaturationResult"):
        from . import session

        return getattr(session, name)
    raise AttributeError(name)
