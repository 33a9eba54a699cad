"""The step of causal-LM generation as plain values: its calling convention, cache layout and buckets.

The frontend's ``causal_lm.step_module`` builds the step and
``runtime.generation`` runs it (its ``Engine`` makes one call per chunk;
``generate`` is transformers' ``model.generate`` on it).  Both modules import
only torch and numpy, never transformers or the compiler.

A *program* is a callable with the step's calling convention::

    logits, new_state = program(input_ids, position_ids, slot_mask, *state)
    #  input_ids, position_ids  int64 [r, T]   (T: a chunk size of the ladder, r: the rows, max_batch or fewer)
    #  slot_mask                bool  [r, C]: the slots a row may read (C: the bucket's context, see below)
    #  state                    the caches, StepSpec.state order (K and V of each layer)
    #  logits                   [r, vocab]: each row's LAST chunk column
    #  new_state                the caches after the call (the same tensors when updated in place)
    #  (a program that updates the state in place may return the logits alone)

The cache layout: row ``b``'s sequence occupies slots ``0 .. n_b-1`` and a
token's position is its slot (no padding is stored), which is the function
transformers computes for a left-padded batch (its ``position_ids`` are
``cumsum(attention_mask) - 1``).  A call feeds each row ``k_b <= T`` real
tokens, placed LAST in the chunk so its final token's logits are the chunk's
last column; the other ``T - k_b`` columns are filler written to slots
``n_b + k_b .. n_b + T - 1``, at or beyond the row's length: masked out of
every read (``slot_mask`` is ``slot < length``) and overwritten later.  So a
prompt is fed exactly, in chunks of the ladder taken largest first
(:meth:`StepSpec.plan`, planned for the least cost: 15 tokens are one chunk
of 16 with one column of filler), and
``cache_len = max_length + max(chunks)`` keeps every filler write in range.
Decoding is the chunk of size 1.

Buckets: one program per *bucket* ``(chunk, context, rows)``, a chunk size of
the ladder, the slots it reads and the rows it computes (:class:`Bucket`).
The program of bucket ``(T, C, r)`` takes ``input_ids [r, T]`` (and
positions of ``r`` rows) and ``slot_mask [r, C]``: it reads slots ``0 .. C-1``
of rows ``0 .. r-1`` (it still writes into the whole cache; the other rows'
part of its one cache write goes to the scratch tail past ``max_length``,
never read).  Every chunk size has the *full* bucket ``(T, full_context,
max_batch)`` (``full_context`` is ``max_length``: no call needs more, filler
is never read); the others are cheaper forms of it:

* context buckets (``StepSpec.contexts``): a call over short sequences need
  not read ``max_length`` slots.  A row's slots at or past ``C`` hold only
  filler when every fed row's length after the call is at most ``C``, so
  bucket ``C`` computes the same logits for those rows.
* row buckets (``StepSpec.rows``): a call costs in proportion to the rows it
  computes (a prompt chunk's products, a decode step's attention over its
  rows' caches and its products' arithmetic), and a batch of one sequence
  would otherwise pay for ``max_batch`` rows.

A call runs the cheapest bucket of its chunk size (fewest rows, then fewest
slots) that computes every fed row and holds every fed row's length
(:meth:`StepPrograms.for_call`); the rows it computes but does not feed
write filler and their logits are not used.  Which buckets are compiled is
:meth:`StepSpec.buckets`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple, Sequence

import torch

from ..errors import InputError
from ..ir import dtypes
from .sampling import Sampling

StepProgram = Callable[..., tuple]


@dataclass(frozen=True)
class StateSpec:
    """One state tensor of the step: its name in the step module, shape and torch dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class StepSpec:
    """What a step program was built for, as plain values (written by the frontend at build time)."""

    max_batch: int
    max_length: int
    chunks: tuple[int, ...]  # the ladder, ascending, starting at 1
    vocab_size: int
    state: tuple[StateSpec, ...]
    defaults: Sampling = field(default_factory=Sampling)
    filler_token: int = 0
    contexts: tuple[int, ...] = ()  # context buckets, ascending, each below full_context (module docstring)
    rows: tuple[int, ...] = ()  # row buckets, ascending, each below max_batch (module docstring)
    max_context: int = 0  # the slots a full bucket reads; 0: the whole cache (artifacts saved before buckets read less)

    @property
    def cache_len(self) -> int:
        return self.max_length + max(self.chunks)

    @property
    def full_context(self) -> int:
        """The slots the full bucket of each chunk size reads (``max_length``; the whole cache in older artifacts)."""
        return self.max_context or self.cache_len

    def buckets(self) -> list["Bucket"]:
        """The buckets a compile builds: for each chunk size, the full rows and each row bucket, reading the
        full context and, for decoding (chunk 1), every context bucket; for a prompt chunk of ``T`` tokens the
        smallest context bucket of at least ``2 T`` slots (it holds a prompt's first two chunks of ``T``: a
        prompt of 128 on the ladder 1, 4, 16, 64 is two chunks of 64 reading 128 slots)."""
        full, b = self.full_context, self.max_batch
        out = []
        for t in self.chunks:
            for r in (*self.rows, b):
                out.append(Bucket(t, full, r))
                if t == 1:
                    out += [Bucket(1, c, r) for c in self.contexts if c < full]
                else:
                    out += [Bucket(t, c, r) for c in self.contexts if 2 * t <= c < full][:1]
        return out

    def plan(self, n: int) -> list[int]:
        """The chunk sizes that feed `n` tokens, largest first, planned for the least cost (:func:`chunk_plan`: a
        call of chunk T costs :data:`CALL_ROWS` + T rows' work, since every call reads all the weights and each
        row it computes, filler too, adds a row's work).  So a prompt a little short of a chunk size is one call
        with filler, not a run of small chunks: 15 -> [16], 17 -> [16, 1], 60 -> [64], 8 -> [4, 4] on the ladder
        1, 4, 16, 64."""
        return list(chunk_plan(n, tuple(self.chunks)))


# What a call of a prompt chunk costs beyond the rows it computes, in rows: a call reads every weight once, as a
# decode step does; its rows (filler too) each add about one row's work.  Measured on an AVX2 Zen 3 core with
# the 494 M model in bfloat16, calls of 1, 4, 16 and 64 tokens took 97, 210, 475 and 1390 ms: a call's fixed
# part is 1.6 (at 4 tokens) to 3.8 (at 64) rows' work there.  2 keeps two one-token calls ahead of one call of
# 4 (194 against 210 ms) and still takes one call of 16 for 15 tokens and one of 64 for 60 (bench/prefill_plan.py:
# 486 against 1100 ms for 4, 4, 4, 1, 1, 1, and 1174 against 2170 ms for 16, 16, 16, 4, 4, 4); where compute is
# cheaper against a weight read (AVX-512, a GPU) a call's fixed part is larger and filler cheaper still.
CALL_ROWS = 2


_COSTS: dict[tuple[int, ...], list[tuple[int, int, int, int]]] = {}  # ladder -> its plan table, grown as asked
_COSTS_LOCK = threading.Lock()


def _cost_table(chunks: tuple[int, ...], n: int) -> list[tuple[int, int, int, int]]:
    """For the ladder `chunks`, entry m (every m <= n) is (cost, rows, calls, first chunk) of feeding m tokens
    the cheapest way; a chunk past what is left carries filler.  One table a ladder, extended only past the
    longest prompt planned so far, so a prompt of a new length costs its plan's calls, not a pass over n."""
    with _COSTS_LOCK:
        best = _COSTS.setdefault(chunks, [(0, 0, 0, 0)])
        for m in range(len(best), n + 1):
            options = []
            for t in chunks:
                cost, rows, calls, _ = best[max(0, m - t)]
                options.append((CALL_ROWS + t + cost, t + rows, 1 + calls, t))
            best.append(min(options))
        return best


def chunk_plan(n: int, chunks: tuple[int, ...]) -> tuple[int, ...]:
    """The chunk sizes, largest first, that feed `n` tokens at the least cost, a call of chunk T costing
    :data:`CALL_ROWS` + T (T rows computed, filler included); among plans of equal cost, the fewest rows computed
    (the least filler), then the fewest calls.  ``chunks`` must hold 1, so every `n` has an exact plan."""
    if n <= 0:
        return ()
    if 1 not in chunks:
        raise ValueError(f"a chunk ladder holds 1 (decoding is its chunk of 1): {list(chunks)}")
    best = _cost_table(tuple(chunks), n)
    out, m = [], n
    while m > 0:
        t = best[m][3]
        out.append(t)
        m = max(0, m - t)
    return tuple(sorted(out, reverse=True))


class Bucket(NamedTuple):
    """What one step program computes: `chunk` tokens per row, reading slots ``0 .. context-1``, for rows
    ``0 .. rows-1`` (module docstring)."""

    chunk: int
    context: int
    rows: int

    @property
    def name(self) -> str:
        """``step_<chunk>_ctx<context>_rows<rows>``: its directory in a saved generation, its key in reports."""
        return f"step_{self.chunk}_ctx{self.context}_rows{self.rows}"


@dataclass
class StepPrograms:
    """The step's spec and its programs, one per bucket (eager torch, or egraft's compiled ones).

    `programs` maps a :class:`Bucket` (or a chunk size ``T``, short for its full
    bucket ``(T, spec.full_context, spec.max_batch)``) to its program; every
    chunk size of the ladder needs its full bucket, the others are optional.
    """

    spec: StepSpec
    programs: Mapping[Bucket | int, StepProgram]

    def __post_init__(self):
        spec = self.spec
        self.programs = {(Bucket(k, spec.full_context, spec.max_batch) if isinstance(k, int) else Bucket(*k)): p
                         for k, p in self.programs.items()}
        missing = [t for t in spec.chunks if Bucket(t, spec.full_context, spec.max_batch) not in self.programs]
        if missing:
            raise InputError(f"no full step program for chunk size(s) {missing}: the ladder {list(spec.chunks)} "
                             f"needs one per size, reading {spec.full_context} slots of {spec.max_batch} rows "
                             f"(given: {sorted(map(tuple, self.programs))})")
        bad = sorted(tuple(b) for b in self.programs if b.chunk not in spec.chunks
                     or not 1 <= b.context <= spec.full_context or not 1 <= b.rows <= spec.max_batch)
        if bad:
            raise InputError(f"step program(s) for bucket(s) {bad}: a bucket is (a chunk size of the ladder "
                             f"{list(spec.chunks)}, a context of at most {spec.full_context} slots, at most "
                             f"max_batch={spec.max_batch} rows)")
        self._by_chunk: dict[int, list[Bucket]] = {}
        for b in sorted(self.programs, key=lambda b: (b.rows, b.context)):  # cheapest first
            self._by_chunk.setdefault(b.chunk, []).append(b)
        self.row_buckets = any(b.rows < spec.max_batch for b in self.programs)
        self.context_buckets = any(b.context < spec.full_context for b in self.programs)

    def for_call(self, t: int, needed: int, rows: int) -> tuple[StepProgram, Bucket]:
        """The program of a chunk-`t` call whose fed rows lie below `rows` and hold at most `needed` slots after
        it, and its bucket: the cheapest (fewest rows, then fewest slots) that computes and holds them."""
        for b in self._by_chunk[t]:
            if rows <= b.rows and needed <= b.context:
                return self.programs[b], b
        raise InputError(f"a chunk-{t} call holding {needed} slots is past the {self.spec.full_context} slots the "
                         f"step's programs read (max_length={self.spec.max_length})")


def check_state(spec: StepSpec, state: Sequence[torch.Tensor], device=None) -> None:
    """InputError naming the first state tensor whose count, shape, dtype or device is not the spec's."""
    if len(state) != len(spec.state):
        raise InputError(f"the step takes {len(spec.state)} state tensor(s) "
                         f"({', '.join(s.name for s in spec.state[:4])}, ...), got {len(state)}")
    for s, x in zip(spec.state, state):
        if not isinstance(x, torch.Tensor) and not is_jax_array(x):
            raise InputError(f"state {s.name!r} must be a torch.Tensor, got {type(x).__name__}")
        if is_jax_array(x) and x.is_deleted():
            raise InputError(f"state {s.name!r} is a jax array that a call consumed (donated) and no new value "
                             "replaced: make fresh caches with new_state(spec)")
        held = str(x.dtype).removeprefix("torch.")
        if is_jax_array(x) and held == "int16" and dtypes.is_half(s.dtype):  # a JAX step's half-type cache: its bits
            held = s.dtype
        if tuple(x.shape) != s.shape or held != s.dtype:
            raise InputError(f"state {s.name!r} is {list(x.shape)}:{str(x.dtype).removeprefix('torch.')}, but the "
                             f"step was built for {list(s.shape)}:{s.dtype}: make it with new_state(spec) or "
                             "rebuild the step for this size")
        if device is not None and isinstance(x, torch.Tensor) and x.device != device:
            raise InputError(f"state {s.name!r} is on {x.device}, the step's other tensors on {device}")


def is_jax_array(x) -> bool:
    """A jax array (a JAX step keeps its caches as jax arrays between calls); jax itself is not imported."""
    return type(x).__module__.startswith(("jax", "jaxlib")) and hasattr(x, "is_deleted")


def new_state(spec: StepSpec, device="cpu") -> list[torch.Tensor]:
    """Zeroed caches of the spec's shapes and dtypes."""
    return [torch.zeros(s.shape, dtype=getattr(torch, s.dtype), device=device) for s in spec.state]


__all__ = ["CALL_ROWS", "Bucket", "StepProgram", "StateSpec", "StepPrograms", "StepSpec", "check_state", "chunk_plan",
           "is_jax_array", "new_state"]
