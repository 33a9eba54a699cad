"""Generation over a KV cache held as state: each step is one call of one program.

The light half of causal-LM generation (the frontend's ``causal_lm.step_module``
builds the step; this module imports only torch, never transformers or the
compiler).  A *program* is a callable with the step's calling convention::

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
prompt is fed exactly, in chunks of the ladder taken largest first, and
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

from dataclasses import dataclass, field
from typing import Callable, Mapping, MutableSequence, NamedTuple, Sequence

import numpy as np
import torch

from ..errors import InputError
from .sampling import UNSET, Sampling, choose

Program = Callable[..., tuple]


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
        """The chunk sizes that feed `n` tokens, largest first (17 -> [16, 1] on the ladder 1, 4, 16)."""
        out = []
        while n > 0:
            t = max(c for c in self.chunks if c <= n)
            out.append(t)
            n -= t
        return out


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
    programs: Mapping[Bucket | int, Program]

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

    def for_call(self, t: int, needed: int, rows: int) -> tuple[Program, Bucket]:
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
        if tuple(x.shape) != s.shape or str(x.dtype).removeprefix("torch.") != s.dtype:
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


class Engine:
    """The step programs and their state, with each cache row's length: one call per chunk (not thread-safe).

    ``run`` makes one call; ``prefill`` feeds whole prompts in ladder chunks;
    ``decode`` feeds one token per active row.  Rows not fed in a call write
    filler beyond their length, so they are left as they were.

    The bookkeeping (each row's length, the positions and the slot mask of a
    call, which bucket it takes) is a handful of integers per row, kept on
    the host in numpy: a decode step's own work is then a few microseconds
    of numpy instead of some twenty small torch operations (a third of a
    millisecond per step on one core, measured, against a 4-5 ms step).
    """

    def __init__(self, programs: StepPrograms, state: MutableSequence[torch.Tensor] | None = None, device=None):
        self.spec = spec = programs.spec
        self.steps, self.programs = programs, programs.programs
        if state is None:
            state = new_state(spec, device or "cpu")
        device = state[0].device if len(state) and isinstance(state[0], torch.Tensor) else torch.device(device or "cpu")
        check_state(spec, state, device)
        self.state, self.device = state, device
        self.calls = 0  # program calls made
        self.lengths = np.zeros(spec.max_batch, dtype=np.int64)  # host: each row's tokens in the cache
        self._slots = np.arange(spec.full_context)
        self._cols = {t: np.arange(t) for t in spec.chunks}

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(x)
        return t if self.device.type == "cpu" else t.to(self.device)

    def _fed_rows(self, fed: np.ndarray) -> int:
        """One past the last row the call feeds (picks the row bucket; not read without row buckets)."""
        if not self.steps.row_buckets:
            return self.spec.max_batch
        rows = np.flatnonzero(fed)
        return int(rows[-1]) + 1 if len(rows) else 1

    def _longest(self, new_lengths: np.ndarray, fed: np.ndarray) -> int:
        """The longest fed row after the call, which picks the context bucket."""
        if not self.steps.context_buckets:
            return self.spec.full_context
        return int(np.where(fed > 0, new_lengths, 0).max())

    def free(self, row: int | None = None) -> None:
        """Forget row `row`'s sequence (every row when None): its slots are masked out and written over."""
        if row is None:
            self.lengths[:] = 0
        else:
            self.lengths[row] = 0

    def run(self, t: int, input_ids: torch.Tensor, fed) -> torch.Tensor:
        """One call of the chunk-`t` program: `input_ids` [max_batch, t] with each row's `fed` [max_batch] real
        tokens last (the rest is filler); returns the logits of each row's last column [r, vocab] for the rows
        ``0 .. r-1`` the call computed (``r = max_batch`` unless a row bucket holds every fed row).

        The callers keep every row within ``max_length`` (``prefill`` checks
        it; ``generate`` and the session refuse a request that could pass it).
        `fed`: ints on the host (a numpy array or list), or a tensor (read once).
        """
        fed = _host(fed).astype(np.int64)
        lengths = self.lengths
        new_lengths = lengths + fed
        if t == 1:  # the token (or filler) of each row at its length
            pos = lengths[:, None]
        else:  # column j of a row fed k tokens: real token at slot n + (j - (t - k)) for j >= t - k, filler at n + j + k
            pos = lengths[:, None] + (self._cols[t][None, :] - (t - fed)[:, None]) % t
        program, bucket = self.steps.for_call(t, self._longest(new_lengths, fed), self._fed_rows(fed))
        mask = self._slots[None, :bucket.context] < new_lengths[:, None]
        r = bucket.rows
        if r < self.spec.max_batch:  # rows r.. are not fed: their lengths stay, their slots are not written
            input_ids, pos, mask = input_ids[:r], pos[:r], mask[:r]
        out = program(input_ids, self._tensor(np.ascontiguousarray(pos)), self._tensor(mask), *self.state)
        logits, new = (out, self.state) if isinstance(out, torch.Tensor) else out  # logits alone: updated in place
        if len(new) != len(self.state):
            raise InputError(f"the chunk-{t} step program returned {len(new)} state tensor(s), "
                             f"the step has {len(self.state)}")
        for i, x in enumerate(new):
            if x is not self.state[i]:
                self.state[i] = x
        self.lengths = new_lengths
        self.calls += 1
        return logits

    def prefill(self, prompts: Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Feed each row's prompt (row -> int64 [n]) after what the row holds; each row's last-token logits."""
        spec, b = self.spec, self.spec.max_batch
        left = {r: p.to(device=self.device, dtype=torch.int64).reshape(-1) for r, p in prompts.items()}
        for r, p in left.items():
            if int(self.lengths[r]) + len(p) > spec.max_length:
                raise InputError(f"row {r} holds {int(self.lengths[r])} tokens; {len(p)} more is over the step's "
                                 f"max_length={spec.max_length}")
        out: dict[int, torch.Tensor] = {}
        while left:
            t = max(c for c in spec.chunks if c <= max(len(p) for p in left.values()))
            ids = torch.full((b, t), spec.filler_token, dtype=torch.int64, device=self.device)
            fed = np.zeros(b, dtype=np.int64)
            for r, p in left.items():
                k = min(t, len(p))
                ids[r, t - k:] = p[:k]
                fed[r] = k
            logits = self.run(t, ids, fed)
            for r in list(left):
                left[r] = left[r][int(fed[r]):]
                if not len(left[r]):
                    out[r] = logits[r]
                    del left[r]
        return out

    def decode(self, tokens, active) -> torch.Tensor:
        """Feed `tokens` [max_batch] to the `active` [max_batch] rows (tensors, or numpy arrays on the host);
        logits [r, vocab] (see :meth:`run`)."""
        act = _host(active).astype(bool)
        ids = np.where(act, _host(tokens), self.spec.filler_token).astype(np.int64)
        return self.run(1, self._tensor(ids[:, None]), act)


def _host(x) -> np.ndarray:
    """A tensor (read back once) or host values (numpy array, list) as a numpy array."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def check_request(spec: StepSpec, prompt_length: int, max_new_tokens) -> None:
    """InputError unless `max_new_tokens` is an int >= 1 and the prompt plus it fits the step's max_length."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InputError(f"max_new_tokens={max_new_tokens!r}: it must be an int >= 1")
    if prompt_length + max_new_tokens > spec.max_length:
        raise InputError(f"a prompt of {prompt_length} tokens + max_new_tokens={max_new_tokens} is "
                         f"{prompt_length + max_new_tokens} tokens, over the step's max_length={spec.max_length}: "
                         "shorten the request or rebuild the step with a larger max_length")


def prompt_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, s: Sampling) -> list[int]:
    """Each row's count of real tokens of a left-padded batch; transformers' mask inference when none is given."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.dtype not in (torch.int64,
                                                                                                  torch.int32):
        raise InputError("input_ids must be an int64 tensor [batch, prompt_length], got "
                         f"{type(input_ids).__name__} {getattr(input_ids, 'shape', '')}")
    if attention_mask is None:  # transformers: infer from pad tokens when pad is set and is no eos token
        pad, eos = s.pad_token_id, s.eos_token_id or ()
        if pad is not None and pad not in eos and bool((input_ids == pad).any()):
            attention_mask = input_ids != pad
        else:
            attention_mask = torch.ones_like(input_ids)
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise InputError(f"attention_mask is {list(attention_mask.shape)}, input_ids {list(input_ids.shape)}: "
                         "they must have one shape")
    m = attention_mask.to(torch.int64).cpu()
    n = m.sum(dim=1)
    want = (torch.arange(m.shape[1])[None, :] >= (m.shape[1] - n)[:, None]).to(torch.int64)
    if not torch.equal(m, want):
        bad = int((m != want).any(dim=1).nonzero()[0, 0])
        raise InputError(f"row {bad} of attention_mask is not left padding (zeros, then ones): "
                         "pad prompts on the left (tokenizer.padding_side = 'left')")
    if int(n.min()) < 1:
        raise InputError(f"row {int(n.argmin())} of the batch has no prompt token (its attention_mask is all 0)")
    return n.tolist()


def generate(programs: StepPrograms, state: MutableSequence[torch.Tensor] | None, input_ids: torch.Tensor,
             attention_mask: torch.Tensor | None = None, *, max_new_tokens: int, do_sample=UNSET,
             temperature=UNSET, top_k=UNSET, top_p=UNSET, eos_token_id=UNSET, pad_token_id=UNSET,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """transformers' ``model.generate`` (greedy or multinomial sampling) on step programs.

    Returns int64 [batch, prompt_length + steps]: the prompt as given (left
    padded), then the new tokens; a row that produced an eos token gets
    ``pad_token_id`` afterwards, and generation stops once every row has.
    Options not given take the defaults the step was built with
    (``programs.spec.defaults``: the model's ``generation_config`` over
    transformers' own defaults, e.g. ``top_k=50``); an explicit None turns an
    option off, as in transformers (``eos_token_id=None``: no eos).  Sampling draws from
    `generator` (None: torch's global generator, as transformers does), so
    ``torch.manual_seed(s)`` before each gives the same tokens.  `state` (a
    list, updated in place; None: fresh caches) holds the caches.
    """
    spec = programs.spec
    s = spec.defaults.with_(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                            eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    n = prompt_rows(input_ids, attention_mask, s)
    batch = len(n)
    if batch > spec.max_batch:
        raise InputError(f"a batch of {batch} rows is over the step's max_batch={spec.max_batch}: "
                         "split the batch or rebuild the step with a larger max_batch")
    check_request(spec, max(n), max_new_tokens)
    engine = Engine(programs, state, None if state else input_ids.device)
    dev = engine.device
    ids = input_ids.to(device=dev, dtype=torch.int64)
    logits = engine.prefill({r: ids[r, ids.shape[1] - n[r]:] for r in range(batch)})
    logits = torch.stack([logits[r] for r in range(batch)])
    # the stopping test on the host (numpy): the tokens come to the host once per step, the only read a step makes
    eos = np.asarray(s.eos_token_id, dtype=np.int64) if s.eos_token_id else None
    unfinished = np.ones(batch, dtype=bool)
    new: list[np.ndarray] = []
    tokens = np.full(spec.max_batch, spec.filler_token, dtype=np.int64)
    active = np.zeros(spec.max_batch, dtype=bool)
    for step in range(max_new_tokens):
        # sampling: a finished row's scores are set to 0, so the draws of the others are those of transformers'
        # [batch, vocab] call; greedy: a finished row's token is replaced by the pad below whatever it is
        scores = (torch.where(engine._tensor(unfinished)[:, None], logits.float(), 0.0) if s.do_sample
                  else logits)
        nxt = choose(scores, s, generator).cpu().numpy()
        if eos is not None:
            nxt = np.where(unfinished, nxt, s.pad_token_id)
            unfinished = unfinished & ~(nxt[:, None] == eos[None, :]).any(axis=1)
        new.append(nxt)
        if step == max_new_tokens - 1 or not unfinished.any():
            break
        tokens[:batch], active[:batch] = nxt, unfinished
        logits = engine.decode(tokens, active)[:batch]
    out = torch.from_numpy(np.stack(new, axis=1)).to(device=dev, dtype=input_ids.dtype)
    return torch.cat([input_ids.to(dev), out], dim=1)


__all__ = ["Bucket", "Engine", "Program", "StateSpec", "StepPrograms", "StepSpec", "check_state", "generate", "is_jax_array",
           "new_state", "prompt_rows"]
