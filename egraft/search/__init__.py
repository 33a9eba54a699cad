"""Search over the e-graph: the plain-Python Space and extraction of programs from it."""

from .space import Space, default_cost

__all__ = ["Space", "default_cost"]
