"""Quantised weights' custom ops (``egraft.frontend.quantize``): ``egraft::unpack_int4`` is the IR's ``Nibble``."""

from __future__ import annotations

from .table import lowering


@lowering("egraft.unpack_int4")
def unpack_int4(ctx, packed):
    return packed.unpack_int4()
