"""Looking inside a saturation: rule firings, e-graph size per iteration, DOT rendering."""

from __future__ import annotations

from ..ir import Op
from ..ir.egraph import Snapshot


def firing_table(result, top: int | None = None) -> str:
    """Rule firings (matches applied), most frequent first, as a text table."""
    rows = result.firings.most_common(top)
    if not rows:
        return "no rule fired"
    w = max(len(r) for r, _ in rows)
    return "\n".join([f"{'rule':<{w}}  firings", f"{'-' * w}  -------"] + [f"{r:<{w}}  {n:>7}" for r, n in rows])


def size_table(result) -> str:
    """E-graph size after every iteration (phase, e-nodes, e-classes, seconds, matches)."""
    lines = ["iter  phase      e-nodes  e-classes  seconds  matches"]
    for i, h in enumerate(result.history):
        lines.append(f"{i:>4}  {h.phase:<9} {h.nodes:>8} {h.classes:>10} {h.seconds:>8.3f} {h.matches:>8}")
    lines.append(f"stop: {result.stop_reason}")
    return "\n".join(lines)


def _label(n) -> str:
    a = n.attrs.as_dict()
    if n.op == Op.Input:
        return f"Input {a['name']}"
    if n.op == Op.Constant:
        v = a["value"]
        return f"Const {v!r}" if len(repr(v)) < 16 else "Const tensor"
    if n.op == Op.View:
        return f"View {list(a['shape'])}/{list(a['strides'])}+{a['offset']}"
    extra = " ".join(f"{k}={v}" for k, v in a.items())
    return f"{n.op} {extra}".strip()


def to_dot(snap: Snapshot | object, max_classes: int = 300, roots=()) -> str:
    """A graphviz DOT string: one cluster per e-class, edges from e-nodes to child classes.

    Accepts a Snapshot or a search.Space (anything with nodes/classes/shape/dtype).
    Larger e-graphs are cut at `max_classes` classes (the lowest ids).
    """
    n_cls = min(len(snap.classes), max_classes)
    out = ["digraph egraph {", "  compound=true; rankdir=BT; node [shape=box, fontsize=10];"]
    anchor = {}
    for c in range(n_cls):
        members = snap.classes[c]
        shape = snap.shape[c]
        style = ', color="red"' if c in set(roots) else ""
        out.append(f'  subgraph cluster_{c} {{ label="e{c} {list(shape) if shape is not None else "?"} '
                   f'{snap.dtype[c] or ""}"; style=dashed{style};')
        if not members:
            out.append(f'    e{c}_empty [label="(empty)"];')
            anchor[c] = f"e{c}_empty"
        for i in members:
            label = _label(snap.nodes[i]).replace('"', "'")
            out.append(f'    n{i} [label="{label}"];')
            anchor.setdefault(c, f"n{i}")
        out.append("  }")
    for c in range(n_cls):
        for i in snap.classes[c]:
            for k, child in enumerate(snap.nodes[i].children):
                if child < n_cls:
                    out.append(f"  n{i} -> {anchor[child]} [lhead=cluster_{child}, label={k}];")
    out.append("}")
    return "\n".join(out)
