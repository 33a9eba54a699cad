"""All op definitions (primitives, leaves, View and idioms) in one lookup."""

from __future__ import annotations

from ..errors import IRError
from .idioms import IDIOMS
from .ops import BASE_OPS, OpDef, PRIMITIVES

OPS: dict[str, OpDef] = {**BASE_OPS, **IDIOMS}


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise IRError(f"unknown IR op {name!r}; known ops: {', '.join(sorted(OPS))}") from None


__all__ = ["OPS", "PRIMITIVES", "IDIOMS", "get_op"]
