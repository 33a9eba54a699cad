"""Every registered rule: the ``RULES`` of each module in :data:`egraft.rewrites.rules.MODULES`."""

from __future__ import annotations

from typing import Iterable

from .rule import RuleSpec
from .rules import MODULES


def all_rules(families: Iterable[str] | None = None, explosive: bool = True) -> list[RuleSpec]:
    """Every registered rule (optionally only some families / no explosive ones), in registry order."""
    fams = set(families) if families is not None else None
    out: list[RuleSpec] = []
    seen: dict[str, str] = {}
    for mod in MODULES:
        for r in mod.RULES:
            if r.name in seen:
                raise ValueError(f"rule name {r.name!r} is declared twice ({seen[r.name]} and {mod.__name__})")
            seen[r.name] = mod.__name__
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
