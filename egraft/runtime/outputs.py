"""A model's output structure as JSON, and the structure rebuilt around a flat list of tensors.

A compiled program returns its outputs flat, in the order ``egraft.trace``
flattens them (torch's pytree order: tuples and lists item by item, dicts in
insertion order, nested containers depth first, ``None`` dropped).  The
artifact records the structure once (``describe``, at save time, from one
real output of the model) so the runtime can hand a serving process what the
model itself returns (``rebuild``), without importing torch or transformers.

The tree is plain JSON, one node per value::

    {"type": "tensor"}                    a tensor (anything with .shape and .dtype)
    {"type": "none"}                      a None (kept in place, takes no tensor)
    {"type": "tuple" | "list", "items": [...]}
    {"type": "dict", "keys": [...], "items": [...]}

A Hugging Face ``ModelOutput`` is a dict subclass whose keys are its non-None
fields, so it is recorded (and rebuilt) as a dict of those fields, with its
class name under ``"class"`` for the reader; a namedtuple is recorded as a
tuple, likewise with ``"class"``.  Types are recognised by duck typing, so
this module imports neither torch nor transformers.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from ..errors import ArtifactError, InputError

TENSOR = {"type": "tensor"}


def _is_tensor(obj) -> bool:
    return hasattr(obj, "shape") and hasattr(obj, "dtype") and not isinstance(obj, (dict, list, tuple))


def describe(obj: Any, path: str = "output") -> dict:
    """The JSON tree of `obj`'s structure (see the module docstring); `path` names a bad leaf in errors."""
    if obj is None:
        return {"type": "none"}
    if _is_tensor(obj):
        return dict(TENSOR)
    if isinstance(obj, dict):
        keys = list(obj.keys())
        bad = [k for k in keys if not isinstance(k, (str, int)) or isinstance(k, bool)]
        if bad:
            raise InputError(f"{path} is a dict with key {bad[0]!r}; egraft records dict keys that are str or int")
        node = {"type": "dict", "keys": keys, "items": [describe(obj[k], f"{path}[{k!r}]") for k in keys]}
        if type(obj) is not dict:
            node["class"] = type(obj).__name__
        return node
    if isinstance(obj, (tuple, list)):
        node = {"type": "tuple" if isinstance(obj, tuple) else "list",
                "items": [describe(x, f"{path}[{i}]") for i, x in enumerate(obj)]}
        if type(obj) not in (tuple, list):
            node["class"] = type(obj).__name__
        return node
    raise InputError(f"{path} is a {type(obj).__name__}; egraft records model outputs made of tensors, "
                     "tuples, lists, dicts (Hugging Face ModelOutput included) and None")


def flat_tree(n: int) -> dict:
    """The tree of a program whose structure is unknown: a list of its `n` outputs, as an Executable returns."""
    return {"type": "list", "items": [dict(TENSOR) for _ in range(n)]}


def count(tree: dict) -> int:
    """How many tensors the tree takes."""
    kind = tree.get("type")
    if kind == "tensor":
        return 1
    if kind == "none":
        return 0
    return sum(count(t) for t in tree.get("items", ()))


def check(tree: Any, where: str = "output_tree") -> None:
    """Raise ArtifactError when `tree` is not a well-formed output tree."""
    if not isinstance(tree, dict) or tree.get("type") not in ("tensor", "none", "tuple", "list", "dict"):
        raise ArtifactError(f"{where} is not an output tree node: {tree!r:.120}")
    if tree["type"] in ("tuple", "list", "dict"):
        items = tree.get("items")
        if not isinstance(items, list):
            raise ArtifactError(f"{where} ({tree['type']}) has no list of items")
        if tree["type"] == "dict" and (not isinstance(tree.get("keys"), list) or len(tree["keys"]) != len(items)):
            raise ArtifactError(f"{where} (dict) needs one key per item")
        for i, t in enumerate(items):
            check(t, f"{where}.items[{i}]")


def rebuild(tree: dict, flat: Sequence) -> Any:
    """The structure `tree` describes, filled with `flat`'s tensors in order (all of them, exactly)."""
    want = count(tree)
    if want != len(flat):
        raise ArtifactError(f"the output structure takes {want} tensor(s), the program returned {len(flat)}; "
                            "the artifact is inconsistent: rebuild it with `egraft compile`")
    if tree["type"] == "tensor":  # the common case, without the iterator
        return flat[0]
    return _build(tree, iter(flat))


def _build(tree: dict, it: Iterator) -> Any:
    kind = tree["type"]
    if kind == "tensor":
        return next(it)
    if kind == "none":
        return None
    items = [_build(t, it) for t in tree["items"]]
    if kind == "tuple":
        return tuple(items)
    if kind == "list":
        return items
    return dict(zip(tree["keys"], items))


__all__ = ["check", "count", "describe", "flat_tree", "rebuild"]
