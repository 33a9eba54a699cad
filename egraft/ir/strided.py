"""The strided-view analysis: what a ``View`` reads, in one place.

``View(x, shape, strides, offset)`` reads the logical row-major flattening
of ``x``: ``out[i] = flat(x)[offset + sum_d i_d * strides_d]``.  Strides may
be zero (broadcast) or negative (flip).  Every consumer of views asks one of
three questions, answered here for all of them:

* **Which source coordinate does an output index read?**  :func:`read_map`
  splits each output axis into *pieces* (mixed-radix digits, outer ->
  inner), each walking one source dimension with a fixed signed step, or
  broadcast.  A map is only returned when no digit can carry into a coarser
  source dimension for *any* output index (checked against the offset's
  digits), so it is exact, never a guess.  A negative stride is simply a
  negative step: the map starts at the offset's digits and walks down.
  :func:`digit_map` is the special case where every output axis is one
  piece, so each source coordinate is affine in the output index (the
  Triton index generator's form, free of ``//`` and ``%``).
  :func:`through_view` follows a chain of views one link down, and
  :func:`common_axes` refines several operands' maps of one index space to
  common digits (how window recognisers tell a convolution's roles apart).
* **Is a view of a view one view?**  :func:`compose_views` maps the outer
  view onto the inner view's merged digits (:func:`merge_runs`) and reads
  off physical strides.
* **Which movement ops realise a view of a flat buffer?**  :func:`box_plan`
  (module :mod:`.strided_box`) decomposes a view whose strides nest into
  flip, pad, reshape, strided slice, transpose and broadcast steps.

Pure Python/numpy, so backends share it and tests check it against the
reference definition, :func:`gather_index`.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import NamedTuple, Sequence

import numpy as np

from .shapes import contiguous_strides

View = tuple  # (shape, strides, offset)


def gather_index(shape: Sequence[int], strides: Sequence[int], offset: int) -> np.ndarray:
    """The flat source index every view element reads: the definition the rest is checked against."""
    index = np.full(tuple(shape), offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(shape, strides)):
        if s and n > 1:
            index += (np.arange(n, dtype=np.int64) * s).reshape((n,) + (1,) * (len(shape) - d - 1))
    return index


def merge_runs(sizes: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[int]]:
    """Merge adjacent dims that walk one run (outer stride == inner size * inner stride); drop size-1 dims.

    The merged dims read the same elements in the same order: a row-major
    index over the merged sizes times the merged strides equals the
    original.  Works for any sign.  Empty lists mean one element.
    """
    m_sizes: list[int] = []
    m_strides: list[int] = []
    for n, s in zip(sizes, strides):
        if n == 1:
            continue
        if m_sizes and m_strides[-1] == n * s:
            m_sizes[-1] *= n
            m_strides[-1] = s
        else:
            m_sizes.append(n)
            m_strides.append(s)
    return m_sizes, m_strides


def unflip(shape: Sequence[int], strides: Sequence[int], offset: int) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    """Read every negative-stride dim forwards from its far end: (|strides|, new offset, flipped dims).

    The view equals the forward view with the flipped dims reversed
    afterwards (for backends that realise a flip as a ``rev``).
    """
    out, flipped = [], []
    for d, (n, s) in enumerate(zip(shape, strides)):
        if s < 0 and n > 1:
            offset += (n - 1) * s
            flipped.append(d)
        out.append(abs(s))
    return tuple(out), offset, tuple(flipped)


# --- read maps ------------------------------------------------------------------------------------------

class Piece(NamedTuple):
    """One digit of an output axis: ``size`` values walking source dim ``dim`` by ``step`` (None: broadcast)."""

    size: int
    dim: int | None
    step: int


@dataclass(frozen=True)
class ReadMap:
    """The source coordinate each output index reads.

    ``pieces[d]`` are output axis d's digits outer -> inner; ``base[j]`` is
    the source coordinate in dim j of output index 0.  Source coordinate j
    of index i is ``base[j] + sum(digit * step)`` over the digits walking j,
    and stays inside ``[0, src_shape[j])`` (no carries).
    """

    pieces: tuple[tuple[Piece, ...], ...]
    base: tuple[int, ...]


def split_axis(size: int, stride: int, src_shape: Sequence[int]) -> list[Piece] | None:
    """Split a walk of `size` flat steps of `stride` (any sign) into per-source-dim digits, outer first.

    A digit walks the source dim j whose place value brackets the stride;
    when the walk leaves dim j it must wrap exactly (dim j a multiple of
    the step, the axis a multiple of the digit) and continues in a coarser
    dim.  Bounds (no carry from the offset) are checked by the caller.
    """
    sign = -1 if stride < 0 else 1
    stride = abs(stride)
    cs = contiguous_strides(src_shape)
    out = []  # inner first
    while size > 1:
        j = next((j for j in range(len(src_shape)) if src_shape[j] > 1 and cs[j] <= stride < cs[j] * src_shape[j]),
                 None)
        if j is None or stride % cs[j]:
            return None
        step = stride // cs[j]
        run = -(-src_shape[j] // step)  # digits that fit inside dim j
        if size <= run:
            out.append(Piece(size, j, sign * step))
            break
        if src_shape[j] % step or size % run:
            return None
        out.append(Piece(run, j, sign * step))
        size //= run
        stride *= run
    return out[::-1]


def view_axes(shape: Sequence[int], strides: Sequence[int]) -> list[list[tuple[int, int | None]]]:
    """A view's axes as flat walks ``[(size, stride or None for broadcast)]`` (the input of :func:`read_pieces`)."""
    return [[(n, s if s != 0 else None)] if n > 1 else [] for n, s in zip(shape, strides)]


def read_pieces(src_shape: Sequence[int], axes, offset: int) -> ReadMap | None:
    """The exact :class:`ReadMap` of flat walks `axes` (per output axis, outer -> inner) from `offset`.

    This is the general form (an axis may already be several walks, as
    when following a chain of views); :func:`read_map` reads one view.
    """
    src_shape = tuple(src_shape)
    n = prod(src_shape)
    if not 0 <= offset < n:
        return None
    base = [int(v) for v in np.unravel_index(offset, src_shape)] if src_shape else []
    hi, lo = list(base), list(base)
    out = []
    for walks in axes:
        mine: list[Piece] = []
        for size, stride in walks:
            if size == 0:
                return None
            if stride is None or stride == 0 or size == 1:
                mine.append(Piece(size, None, 0))
                continue
            parts = split_axis(size, stride, src_shape)
            if parts is None:
                return None
            for p in parts:
                if p.step > 0:
                    hi[p.dim] += (p.size - 1) * p.step
                else:
                    lo[p.dim] += (p.size - 1) * p.step
            mine.extend(parts)
        out.append(tuple(mine))
    # every digit stays inside its dimension, so no index can carry: the map is exact
    if any(h >= m for h, m in zip(hi, src_shape)) or any(v < 0 for v in lo):
        return None
    return ReadMap(tuple(out), tuple(base))


def through_view(m: ReadMap, strides: Sequence[int], offset: int):
    """Re-express a read map of a View's *result* as flat walks of the View's source: ``(axes, offset)``.

    Feeding the result to :func:`read_pieces` with the source's shape follows
    a chain of views one link down (what a chain's reader needs).
    """
    off = offset + sum(b * s for b, s in zip(m.base, strides))
    axes = [[(p.size, p.step * strides[p.dim] if p.dim is not None and strides[p.dim] != 0 else None) for p in pieces]
            for pieces in m.pieces]
    return axes, off


def read_map(src_shape: Sequence[int], shape: Sequence[int], strides: Sequence[int], offset: int) -> ReadMap | None:
    """The exact :class:`ReadMap` of one view, or None (empty view, or some index would carry)."""
    if prod(shape) == 0:
        return None
    return read_pieces(src_shape, view_axes(shape, strides), offset)


def digit_map(src_shape, shape, strides, offset):
    """Per source dim j: ``(base_j, [(view dim d, coefficient c), ...])``, so ``src_j = base_j + sum c * i_d``.

    None unless every view axis walks inside one source dim (expand,
    permute, slices with steps, flips, selects, splitting reshapes);
    merging reshapes need ``//`` and ``%`` instead.
    """
    m = read_map(src_shape, shape, strides, offset)
    if m is None or any(len(p) > 1 for p in m.pieces):
        return None
    terms: list[list] = [[] for _ in src_shape]
    for d, pieces in enumerate(m.pieces):
        for p in pieces:
            if p.dim is not None:
                terms[p.dim].append((d, p.step))
    return [(m.base[j], terms[j]) for j in range(len(src_shape))]


def compose_views(inner_src_shape: Sequence[int], inner: View, outer: View) -> View | None:
    """One view equal to ``outer`` applied to the result of ``inner``, or None.

    The outer view reads the inner view's logical layout, whose merged
    digits (:func:`merge_runs`) each have a physical stride.  The
    composition is one strided view exactly when the outer view has a
    :func:`read_map` over those digits and each outer axis's digits chain
    physically: that covers chains of reshape/permute/expand/slice/flip.
    Otherwise None, and the caller keeps both views.
    """
    ishape, istrides, ioff = inner
    oshape, ostrides, ooff = outer
    if prod(oshape) == 0 or prod(ishape) == 0:
        return None
    sizes, phys = merge_runs(ishape, istrides)
    m = read_map(tuple(sizes), oshape, ostrides, ooff)
    if m is None:
        return None
    new_strides = []
    for n, pieces in zip(oshape, m.pieces):
        stride, span = 0, 1
        for k, p in enumerate(reversed(pieces)):  # inner -> outer
            ps = p.step * phys[p.dim] if p.dim is not None else 0
            if k == 0:
                stride = ps
            elif ps != stride * span:
                return None
            span *= p.size
        new_strides.append(stride if n > 1 else 0)
    off = ioff + sum(b * p for b, p in zip(m.base, phys))
    return tuple(oshape), tuple(new_strides), off


# --- several operands over one index space ---------------------------------------------------------------

def merge_pieces(pieces: Sequence[Piece]) -> tuple[Piece, ...]:
    """Canonical digits: adjacent broadcast digits, or digits continuing each other in one dim, merge."""
    out: list[Piece] = []
    for p in pieces:  # outer -> inner
        if out:
            q = out[-1]
            if q.dim is None and p.dim is None:
                out[-1] = Piece(q.size * p.size, None, 0)
                continue
            if q.dim is not None and q.dim == p.dim and q.step == p.step * p.size:
                out[-1] = Piece(q.size * p.size, p.dim, p.step)
                continue
        out.append(Piece(*p))
    return tuple(out)


def _cuts(pieces) -> list[int]:
    """Cumulative digit sizes from the inner end (the positions where an axis splits)."""
    out, p = [], 1
    for size, _, _ in reversed(pieces[1:]):
        p *= size
        out.append(p)
    return out


def _refine(pieces, bounds) -> list[Piece]:
    """Re-express digits on the finer boundaries `bounds` (inner-cumulative sizes, ascending, last = total)."""
    spans = []  # (lo, hi, dim, step): the digit covers cumulative range [lo, hi)
    p = 1
    for size, dim, step in reversed(pieces):
        spans.append((p, p * size, dim, step))
        p *= size
    out = []
    lo = 1
    for hi in bounds:
        span = next(s for s in spans if s[0] <= lo and hi <= s[1])
        out.append(Piece(hi // lo, span[2], span[3] * (lo // span[0]) if span[2] is not None else 0))
        lo = hi
    return out[::-1]


@dataclass(frozen=True)
class VAxis:
    """A virtual axis: a digit common to every operand's map; per operand (source dim, step) or None."""

    owner: int  # the output axis it belongs to
    size: int
    a: tuple[int, int] | None
    b: tuple[int, int] | None


def common_axes(shape: Sequence[int], piece_lists) -> list[VAxis] | None:
    """One or two operands' digits (``piece_lists[k][d]`` for output axis d) refined to common virtual axes.

    Outer -> inner within each output axis; None when the operands' digit
    boundaries do not divide each other.
    """
    out = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        plist = [pl[d] for pl in piece_lists]
        cuts = sorted(set(c for p in plist for c in _cuts(p)) | {n})
        if any(b % a for a, b in zip([1] + cuts, cuts)):
            return None
        ref = [_refine(p, cuts) for p in plist]
        for k in range(len(cuts)):
            roles = [(r[k].dim, r[k].step) if r[k].dim is not None else None for r in ref]
            out.append(VAxis(d, ref[0][k].size, roles[0], roles[1] if len(roles) > 1 else None))
    return out
