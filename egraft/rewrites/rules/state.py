"""State rules: what the e-graph may say about reads and writes of one buffer (``Scatter`` / ``Gather``).

The e-graph never moves a read of a state buffer across a write to it.  In
this functional IR a write is a value, not an effect: ``Scatter(x, i, u)``
is a new tensor, and a read of the *old* value is a read of ``x`` (the
``Input`` node of the state buffer) while a read of the *new* value reads
the ``Scatter``.  The two are different e-classes, and a rule may relate
them only where its witness proves it, checked against numpy like every
rule.  The two here are the ones that hold for any index (the IR's indices
are in range and distinct along the axis within each line):

* ``write-after-write``: ``Scatter(Scatter(x, i, u1), i, u2) = Scatter(x, i, u2)``,
  the second write covers every element the first one wrote;
* ``store-to-load``: ``Gather(Scatter(x, i, u), i) = u``, a read at the
  positions just written returns what was written there.

Both match the *same* index e-class (and axis): with another index ``j``
nothing is said, because ``j`` may hit some written positions and miss
others.  The tempting ``Gather(Scatter(x, i, u), j) = Gather(x, j)`` (a read
moved across the write) is unsound, and
``tests/rewrites/test_negative_controls.py`` checks that the witness
machinery rejects it.
"""

from __future__ import annotations

from ...ir.builder import GraphBuilder
from ..rule import RuleSpec, Witness, rand_shape


def _layout(rng):
    """A random target shape, an axis, and the index shape (k <= n positions along the axis)."""
    shape = rand_shape(rng, lo=2)
    ax = int(rng.integers(len(shape)))
    k = int(rng.integers(1, shape[ax] + 1))
    return shape, ax, shape[:ax] + (k,) + shape[ax + 1:]


def _index(b, name, shape, ax, dt: str, positions: bool):
    """An index input: a full index tensor, or a position vector broadcast along the other axes."""
    if not positions:
        return b.input(name, shape, dt)
    pos = b.input(name, (shape[ax],), dt)
    return pos.reshape(tuple(shape[ax] if d == ax else 1 for d in range(len(shape)))).expand(shape)


def _w_write_after_write(positions: bool, same: bool = True):
    def make(rng):
        shape, ax, ishape = _layout(rng)
        dt = "int64" if rng.random() < 0.5 else "int32"
        b = GraphBuilder()
        x = b.input("x", shape, "float32")
        i = _index(b, "i", ishape, ax, dt, positions)
        j = i if same else _index(b, "j", ishape, ax, dt, positions)
        u1, u2 = b.input("u1", ishape, "float32"), b.input("u2", ishape, "float32")
        lhs = b.build([x.scatter(ax, i, u1.sin()).scatter(ax, j, u2)])
        if not same:
            return Witness(lhs)
        b2 = GraphBuilder()
        x2 = b2.input("x", shape, "float32")
        i2 = _index(b2, "i", ishape, ax, dt, positions)
        b2.input("u1", ishape, "float32")
        rhs = b2.build([x2.scatter(ax, i2, b2.input("u2", ishape, "float32"))])
        return Witness(lhs, rhs)
    return make


def _w_store_to_load(positions: bool, same: bool = True):
    def make(rng):
        shape, ax, ishape = _layout(rng)
        b = GraphBuilder()
        x = b.input("x", shape, "float32")
        i = _index(b, "i", ishape, ax, "int64" if rng.random() < 0.5 else "int32", positions)
        u = b.input("u", ishape, "float32")
        new = (x * 2.0).scatter(ax, i, u)
        if same:
            return Witness(b.build([new.gather(ax, i) + 1.0]))
        j = b.input("j", ishape, "int64")  # another read: may hit written positions and miss others
        return Witness(b.build([new.gather(ax, j) + 1.0]))
    return make


RULES = [
    RuleSpec("state.write-after-write",
             "(rewrite (Scatter (Scatter x i u1 ax) i u2 ax) (Scatter x i u2 ax))",
             witness=_w_write_after_write(False), witnesses=(_w_write_after_write(True),),
             near_misses=(_w_write_after_write(False, same=False), _w_write_after_write(True, same=False)),
             doc="a second write to the same indices replaces the first"),
    RuleSpec("state.store-to-load",
             "(rewrite (Gather (Scatter x i u ax) i ax) u)",
             witness=_w_store_to_load(False), witnesses=(_w_store_to_load(True),),
             near_misses=(_w_store_to_load(False, same=False),),
             doc="a read at the positions just written is the written value"),
]
