"""The primitive IR: op table, graph, builder and reference interpreter."""

from . import dtypes, shapes, tensors
from .builder import GraphBuilder, Tensor, cat, stack
from .evaluate import evaluate, to_numpy
from .graph import Attrs, Graph, Node
from .idioms import IDIOMS
from .ops import PRIMITIVES, TensorValue
from .op_groups import OPS, Group, Op, get_op

__all__ = [
    "Attrs", "Graph", "GraphBuilder", "Group", "IDIOMS", "Node", "OPS", "Op", "PRIMITIVES", "Tensor", "TensorValue",
    "cat", "dtypes", "evaluate", "get_op", "shapes", "stack", "tensors", "to_numpy",
]
