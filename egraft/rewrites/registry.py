"""The registry of rule modules: every module listed here exports ``RULES: list[RuleSpec]``.

Modules that do not exist yet are skipped (rule families are added by
different people); a module that exists but fails to import is an error.
"""

from __future__ import annotations

import importlib
from typing import Iterable

from .encode import RuleSpec

RULE_MODULES = (
    "egraft.rewrites.rules_algebra",
    "egraft.rewrites.rules_views",
    "egraft.rewrites.rules_reductions",
    "egraft.rewrites.rules_idioms",
    "egraft.rewrites.rules_models",
)


def _load(name: str) -> list[RuleSpec]:
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name:
            return []
        raise
    return list(getattr(mod, "RULES", []))


def all_rules(families: Iterable[str] | None = None, explosive: bool = True) -> list[RuleSpec]:
    """Every registered rule (optionally only some families / no explosive ones)."""
    fams = set(families) if families is not None else None
    out: list[RuleSpec] = []
    seen: dict[str, str] = {}
    for name in RULE_MODULES:
        for r in _load(name):
            if r.name in seen:
                raise ValueError(f"rule name {r.name!r} is declared twice ({seen[r.name]} and {name})")
            seen[r.name] = name
            if fams is not None and r.family not in fams:
                continue
            if not explosive and r.explosive:
                continue
            out.append(r)
    return out


def rule(name: str) -> RuleSpec:
    for r in all_rules():
        if r.name == name:
            return r
    raise KeyError(f"no rule named {name!r}")
