"""Helpers for writing rule witnesses: small programs on random shapes.

    def _w(rng):
        return Witness(program(lambda x: x * 1.0, rand_shape(rng)))
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..ir.builder import GraphBuilder, Tensor
from ..ir.graph import Graph
from .encode import Witness


def rand_shape(rng: np.random.Generator, rank: int | None = None, lo: int = 1, hi: int = 5) -> tuple[int, ...]:
    rank = int(rng.integers(1, 4)) if rank is None else rank
    return tuple(int(rng.integers(lo, hi + 1)) for _ in range(rank))


def program(build: Callable[..., Tensor | Sequence[Tensor]], *shapes: Sequence[int], dtype: str = "float32") -> Graph:
    """A graph whose inputs x0, x1, ... have `shapes` and whose outputs are build(*inputs)."""
    b = GraphBuilder()
    xs = [b.input(f"x{i}", tuple(s), dtype) for i, s in enumerate(shapes)]
    out = build(*xs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return b.build(outs)


def pair(lhs: Callable, rhs: Callable | None, *shapes, dtype: str = "float32") -> Witness:
    """A Witness from two builder functions over the same inputs."""
    return Witness(program(lhs, *shapes, dtype=dtype), program(rhs, *shapes, dtype=dtype) if rhs else None)
