"""A program's calling convention: each input with its role, the outputs, and which outputs overwrite inputs.

A :class:`Signature` is a plain, frozen value.  The tracer builds one from
``torch.export``'s graph signature; an ``ir.Graph`` derives its own
(``graph.signature``) from its ``Input`` nodes, so the two cannot disagree.
It is the lookup key of a compiled call (:meth:`Signature.key`), the input
list of an artifact's manifest (:meth:`Signature.to_dict`) and what every
backend checks a call's inputs against (``ir.evaluate.check_inputs``).

Roles (:data:`ROLES`):

* ``input`` — passed by the caller on every call, in the program's order;
* ``weight`` — bound to the program, read only (parameters and buffers the
  forward pass does not write), foldable;
* ``state`` — bound to the program and updated in place by it (a buffer the
  forward pass writes, a KV cache): some output holds its new value, and
  ``aliases`` says which.  A state with a ``source`` is a tensor the caller
  passes and the program overwrites (torch.export's input mutation).

``aliases`` are the output -> input pairs ``torch.export`` reports for
mutated buffers and inputs: output ``k`` is the new value of the state
input it names, of the same shape and dtype.

Dims.  A shape is a tuple of dims; a dim is an ``int`` today, and may be a
:class:`Dim` (a named size known to lie in a range) where a program covers
varying sizes.  Everything that compares or prints shapes goes through
:func:`check_shape`, :func:`shape_accepts` and :func:`shape_str` here, so
ranged dims change this module only.  ``ir.Graph`` nodes stay static: a
graph's own signature has int dims.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, Union

from ..errors import IRError
from . import dtypes

ROLES = ("input", "weight", "state")
FORMAT = 1


@dataclass(frozen=True)
class Dim:
    """A dim whose size is known to lie in ``lo..hi`` (``hi=None``: unbounded); dims with one name agree."""

    name: str
    lo: int = 1
    hi: int | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise IRError(f"a Dim needs a non-empty name, got {self.name!r}")
        if not _is_int(self.lo) or self.lo < 0:
            raise IRError(f"Dim {self.name!r}: lo must be an int >= 0, got {self.lo!r}")
        if self.hi is not None and (not _is_int(self.hi) or self.hi < self.lo):
            raise IRError(f"Dim {self.name!r}: hi must be None or an int >= lo ({self.lo}), got {self.hi!r}")

    def accepts(self, n: int) -> bool:
        return self.lo <= n and (self.hi is None or n <= self.hi)

    def __str__(self) -> str:
        return f"{self.name}[{self.lo}..{'' if self.hi is None else self.hi}]"


DimLike = Union[int, Dim]
Shape = tuple  # of DimLike


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --- shape arithmetic: the one place that knows what a dim may be ------------------------------

def check_shape(shape: Iterable[Any], what: str = "shape") -> Shape:
    """`shape` as a tuple of dims (ints >= 0, numpy ints included, or :class:`Dim`); IRError otherwise."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise IRError(f"{what} must be a sequence of dims, got {shape!r}") from None
    out = []
    for d in dims:
        if isinstance(d, Dim):
            out.append(d)
            continue
        try:
            n = int(d) if not isinstance(d, (bool, float, str)) and int(d) == d else None
        except (TypeError, ValueError):
            n = None
        if n is None or n < 0:
            raise IRError(f"{what} {dims!r}: dim {d!r} is neither an int >= 0 nor a Dim")
        out.append(n)
    return tuple(out)


def shape_accepts(shape: Shape, concrete: Sequence[int]) -> bool:
    """Whether a tensor of shape `concrete` fits `shape` (equal ints; a Dim's range; one size per Dim name)."""
    if len(shape) != len(concrete):
        return False
    named: dict[str, int] = {}
    for d, n in zip(shape, concrete):
        if isinstance(d, Dim):
            if not d.accepts(n) or named.setdefault(d.name, n) != n:
                return False
        elif d != n:
            return False
    return True


def shape_str(shape: Shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _dim_json(d: DimLike):
    return {"name": d.name, "lo": d.lo, "hi": d.hi} if isinstance(d, Dim) else d


def _dim_from_json(v) -> DimLike:
    if isinstance(v, dict):
        return Dim(v["name"], v.get("lo", 1), v.get("hi"))
    return v


# --- the specs -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class InputSpec:
    """One program input: its name in the program, role, shape, dtype and the user's own name for it.

    ``source`` is the name the user passes the tensor by (the forward's
    parameter or keyword name), for tensors the caller passes; None for
    tensors the model holds (weights, buffers) and for hand-built graphs.
    """

    name: str
    role: str
    shape: Shape
    dtype: str
    source: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise IRError(f"an input needs a non-empty name, got {self.name!r}")
        if self.role not in ROLES:
            raise IRError(f"input {self.name!r} has role {self.role!r}; the roles are {', '.join(ROLES)}")
        object.__setattr__(self, "shape", check_shape(self.shape, f"input {self.name!r} shape"))
        dtypes.check(self.dtype, f"input {self.name!r}")
        if self.source is not None and (not isinstance(self.source, str) or not self.source):
            raise IRError(f"input {self.name!r}: source must be None or a non-empty name, got {self.source!r}")

    def accepts(self, shape: Sequence[int], dtype: str) -> bool:
        return dtype == self.dtype and shape_accepts(self.shape, shape)

    def describe(self) -> str:
        return f"{shape_str(self.shape)} {self.dtype}"


@dataclass(frozen=True)
class OutputSpec:
    shape: Shape
    dtype: str

    def __post_init__(self):
        object.__setattr__(self, "shape", check_shape(self.shape, "output shape"))
        dtypes.check(self.dtype, "output")


@dataclass(frozen=True)
class Signature:
    """Inputs, outputs, and output -> input aliases.

    ``inputs`` is kept in one order, whatever order it is given in: the call
    inputs (role ``input``) in call order, then the state in the program's
    order, then the weights by name.
    """

    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]
    aliases: tuple[tuple[int, str], ...] = ()
    _by_name: Mapping[str, InputSpec] = field(default=None, init=False, repr=False, compare=False, hash=False)
    _calls: tuple = field(default=(), init=False, repr=False, compare=False, hash=False)
    _runs: tuple = field(default=(), init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        ins = tuple(self.inputs)
        if not all(isinstance(s, InputSpec) for s in ins):
            bad = next(s for s in ins if not isinstance(s, InputSpec))
            raise IRError(f"Signature inputs must be InputSpec, got {type(bad).__name__}")
        # one canonical order: the call inputs and the state as given, then the weights by name (they are
        # bound by name, and a rewrite or an extraction may create their nodes in another order)
        ins = (tuple(s for s in ins if s.role == "input") + tuple(s for s in ins if s.role == "state")
               + tuple(sorted((s for s in ins if s.role == "weight"), key=lambda s: s.name)))
        outs = tuple(o if isinstance(o, OutputSpec) else OutputSpec(*o) for o in self.outputs)
        by_name: dict[str, InputSpec] = {}
        for s in ins:
            if s.name in by_name:
                raise IRError(f"two inputs are named {s.name!r}")
            by_name[s.name] = s
        pairs = self.aliases.items() if isinstance(self.aliases, Mapping) else self.aliases
        aliases = tuple(sorted((int(k), str(n)) for k, n in pairs))
        seen_out, seen_in = set(), set()
        for k, name in aliases:
            if not 0 <= k < len(outs):
                raise IRError(f"alias output {k} does not exist: the program has {len(outs)} output(s)")
            spec = by_name.get(name)
            if spec is None or spec.role != "state":
                raise IRError(f"output {k} is aliased to {name!r}, which is not a state input; an output may "
                              "only overwrite an input of role 'state'")
            if (outs[k].shape, outs[k].dtype) != (spec.shape, spec.dtype):
                raise IRError(f"output {k} ({shape_str(outs[k].shape)} {outs[k].dtype}) cannot overwrite state "
                              f"{name!r} ({spec.describe()}): an alias keeps shape and dtype")
            if k in seen_out or name in seen_in:
                raise IRError(f"alias {k} -> {name!r} repeats an output or an input; each pairs once")
            seen_out.add(k)
            seen_in.add(name)
        object.__setattr__(self, "inputs", ins)
        object.__setattr__(self, "outputs", outs)
        object.__setattr__(self, "aliases", aliases)
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_calls", tuple(s for s in ins if s.role == "input"))  # read on every call
        object.__setattr__(self, "_runs", tuple(s for s in ins if s.role != "weight"))

    # -- lookup -----------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> InputSpec:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no input named {name!r}; the inputs are {', '.join(self._by_name)}") from None

    def role(self, role: str) -> tuple[InputSpec, ...]:
        if role not in ROLES:
            raise IRError(f"unknown role {role!r}; the roles are {', '.join(ROLES)}")
        return tuple(s for s in self.inputs if s.role == role)

    @property
    def call_inputs(self) -> tuple[InputSpec, ...]:
        """What a caller passes on every call (role ``input``), in the program's order."""
        return self._calls

    @property
    def run_inputs(self) -> tuple[InputSpec, ...]:
        """What an executable takes on every call: the call inputs, then the state (its current value)."""
        return self._runs

    @property
    def state(self) -> tuple[InputSpec, ...]:
        return tuple(s for s in self._runs if s.role == "state")

    def alias_map(self) -> dict[int, str]:
        return dict(self.aliases)

    def sources(self) -> list[str | None]:
        """The user's own name for each call input, in call order (None where unknown)."""
        return [s.source for s in self.call_inputs]

    def key(self) -> tuple:
        """The lookup key of a call: ``((shape, dtype), ...)`` per call input, what :func:`call_key` makes."""
        return tuple((s.shape, s.dtype) for s in self.call_inputs)

    def accepts(self, types: Sequence[tuple[Sequence[int], str]]) -> bool:
        """Whether call inputs of these (shape, dtype) fit (every dim, ranged ones included)."""
        ins = self.call_inputs
        return len(types) == len(ins) and all(s.accepts(tuple(sh), dt) for s, (sh, dt) in zip(ins, types))

    # -- JSON ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        def inp(s: InputSpec) -> dict:
            d = {"name": s.name, "role": s.role, "shape": [_dim_json(x) for x in s.shape], "dtype": s.dtype}
            if s.source is not None:
                d["source"] = s.source
            return d

        return {"format": FORMAT, "inputs": [inp(s) for s in self.inputs],
                "outputs": [{"shape": [_dim_json(x) for x in o.shape], "dtype": o.dtype} for o in self.outputs],
                "aliases": [{"output": k, "input": n} for k, n in self.aliases]}

    @classmethod
    def from_dict(cls, doc: Mapping) -> "Signature":
        """The signature :meth:`to_dict` wrote; IRError naming what is wrong with a damaged record."""
        try:
            if doc.get("format") != FORMAT:
                raise IRError(f"signature record has format {doc.get('format')!r}; this egraft reads format {FORMAT}")
            ins = tuple(InputSpec(i["name"], i["role"], tuple(_dim_from_json(x) for x in i["shape"]), i["dtype"],
                                  i.get("source")) for i in doc["inputs"])
            outs = tuple(OutputSpec(tuple(_dim_from_json(x) for x in o["shape"]), o["dtype"]) for o in doc["outputs"])
            return cls(ins, outs, tuple((a["output"], a["input"]) for a in doc.get("aliases", ())))
        except IRError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise IRError(f"signature record is damaged ({type(e).__name__}: {e})") from None


def call_key(types: Iterable[tuple[Sequence[int], str]]) -> tuple:
    """The key :meth:`Signature.key` gives, from a call's ``(shape, dtype)`` per input (static shapes)."""
    return tuple((tuple(int(n) for n in shape), dt) for shape, dt in types)


__all__ = ["Dim", "DimLike", "FORMAT", "InputSpec", "OutputSpec", "ROLES", "Signature", "call_key", "check_shape",
           "shape_accepts", "shape_str"]
