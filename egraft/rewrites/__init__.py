"""Rewrites: encode an IR graph into an egglog e-graph and grow it under limits.

``saturate(graph, rules=None, limits=None) -> SaturationResult``; ``RULES`` is
every registered rule (see :mod:`egraft.rewrites.registry`).
"""

from . import encode  # noqa: F401
from .encode import ENCODING_READY, RuleSpec, Term, Witness  # noqa: F401
from .registry import all_rules
from .saturate import Limits, SaturationResult, saturate

__all__ = ["ENCODING_READY", "Limits", "RULES", "RuleSpec", "SaturationResult", "Term", "Witness",
           "all_rules", "saturate"]


def __getattr__(name):
    if name == "RULES":
        return all_rules()
    raise AttributeError(name)
