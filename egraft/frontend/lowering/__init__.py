"""Lowering rules from core ATen to egraft's primitive IR, one per ATen op.

``LOWERINGS`` maps an ATen op name (``"aten.add"``, or an overload such as
``"aten.max.dim"``) to its :class:`Rule`; importing this package fills it
from the per-family modules below.  ``egraft.frontend.tracer`` drives them.
"""

from . import (activations, creation, elementwise, index, inverse_trig, linalg, movement, nn, quantized,  # noqa: F401
               reduce, sort)  # (fill the table)
from .table import LOWERINGS, UNSUPPORTED_HINTS, Ctx, Missing, Rule, lookup, lowering, op_name

__all__ = ["LOWERINGS", "UNSUPPORTED_HINTS", "Ctx", "Missing", "Rule", "lookup", "lowering", "op_name"]
