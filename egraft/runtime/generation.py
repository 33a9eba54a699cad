"""Generation over a KV cache held as state: each step is one call of one program.

The light half of causal-LM generation (the frontend's ``causal_lm.step_module``
builds the step; this module imports only torch, never transformers or the
compiler).  A *program* is a callable with the step's calling convention::

    logits, new_state = program(input_ids, position_ids, slot_mask, *state)
    #  input_ids, position_ids  int64 [max_batch, T]   (T: one chunk size of the ladder)
    #  slot_mask                bool  [max_batch, cache_len]: the slots a row may read
    #  state                    the caches, StepSpec.state order (K and V of each layer)
    #  logits                   [max_batch, vocab]: each row's LAST chunk column
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
There is one program per chunk size; decoding is the chunk of size 1.

Decode context buckets (``StepSpec.contexts``): a decode step over short
sequences need not read the whole cache.  The program of bucket ``C`` takes
``slot_mask [max_batch, C]`` and reads slots ``0 .. C-1`` only (it still
writes into the whole cache); a decode call whose rows all fit (each row's
length after the call at most ``C``) runs the smallest such bucket, else the
chunk-1 program over the whole cache.  A row's slots at or past ``C`` hold
only filler then, which no call reads, so every bucket computes the same
logits.

Prompt row buckets (``StepSpec.rows``): a prompt chunk costs in proportion
to the rows it computes, and a batch of one prompt would otherwise pay for
``max_batch`` rows.  The chunk-``T`` program of row bucket ``r`` takes
``input_ids [r, T]`` (and positions and mask of ``r`` rows) and computes rows
``0 .. r-1`` only; the other rows' part of its cache write goes to the
scratch tail (slots past ``max_length``, never read).  A prompt call whose
fed rows all lie below ``r`` runs the smallest such bucket and returns those
``r`` rows' logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, MutableSequence, Sequence

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
    contexts: tuple[int, ...] = ()  # decode context buckets, ascending, each below cache_len (module docstring)
    rows: tuple[int, ...] = ()  # prompt row buckets, ascending, each below max_batch (module docstring)

    @property
    def cache_len(self) -> int:
        return self.max_length + max(self.chunks)

    def plan(self, n: int) -> list[int]:
        """The chunk sizes that feed `n` tokens, largest first (17 -> [16, 1] on the ladder 1, 4, 16)."""
        out = []
        while n > 0:
            t = max(c for c in self.chunks if c <= n)
            out.append(t)
            n -= t
        return out


@dataclass
class StepPrograms:
    """The step's spec, one program per chunk size of its ladder (eager torch, or egraft's compiled ones), and
    decode programs of context buckets (``decoders``: bucket -> program reading that many slots; the compiled
    ones have one per bucket of ``spec.contexts``)."""

    spec: StepSpec
    programs: Mapping[int, Program]
    decoders: Mapping[int, Program] = field(default_factory=dict)
    row_programs: Mapping[tuple[int, int], Program] = field(default_factory=dict)  # (chunk, rows) -> program

    def __post_init__(self):
        missing = sorted(set(self.spec.chunks) - set(self.programs))
        if missing:
            raise InputError(f"no step program for chunk size(s) {missing}: the ladder {list(self.spec.chunks)} "
                             f"needs one program per size (given: {sorted(self.programs)})")
        bad = sorted(c for c in self.decoders if not 1 <= c < self.spec.cache_len)
        if bad:
            raise InputError(f"decode program(s) for context bucket(s) {bad}: a bucket reads fewer slots than the "
                             f"cache's {self.spec.cache_len}")
        self._contexts = sorted(self.decoders)
        bad = sorted(k for k in self.row_programs if k[0] not in self.spec.chunks or not 1 <= k[1] < self.spec.max_batch)
        if bad:
            raise InputError(f"row bucket program(s) {bad}: each is (a chunk size of the ladder, rows below "
                             f"max_batch={self.spec.max_batch})")
        self._rows: dict[int, list[int]] = {}
        for t, r in sorted(self.row_programs):
            self._rows.setdefault(t, []).append(r)

    def for_call(self, t: int, needed: int, rows: int) -> tuple[Program, int | None, int]:
        """The program of a chunk-`t` call whose rows hold at most `needed` slots after it and whose fed rows lie
        below `rows`; the slots it reads (None: the whole cache) and the rows it computes.  Buckets without a
        program are skipped."""
        if t == 1:
            for c in self._contexts:
                if needed <= c:
                    return self.decoders[c], c, self.spec.max_batch
        for r in self._rows.get(t, ()):
            if rows <= r:
                return self.row_programs[(t, r)], None, r
        return self.programs[t], None, self.spec.max_batch

    @property
    def row_buckets(self) -> bool:
        return bool(self._rows)


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
        self.lengths = torch.zeros(spec.max_batch, dtype=torch.int64, device=device)
        self._slots = torch.arange(spec.cache_len, device=device)
        self._cols = {t: torch.arange(t, device=device) for t in spec.chunks}

    def _fed_rows(self, t: int, fed: torch.Tensor) -> int:
        """One past the last row the call feeds (picks the prompt row bucket; not read without buckets)."""
        if t == 1 or not self.steps.row_buckets:
            return self.spec.max_batch
        return int(fed.nonzero().max()) + 1 if bool(fed.any()) else 1

    def _longest(self, new_lengths: torch.Tensor) -> int:
        """The longest row after the call, which picks the decode context bucket (one read of a device value per
        step when there are buckets, as the stopping test already makes)."""
        if not self.steps.decoders:
            return self.spec.cache_len
        return int(new_lengths.max())

    def free(self, row: int | None = None) -> None:
        """Forget row `row`'s sequence (every row when None): its slots are masked out and written over."""
        if row is None:
            self.lengths.zero_()
        else:
            self.lengths[row] = 0

    def run(self, t: int, input_ids: torch.Tensor, fed: torch.Tensor) -> torch.Tensor:
        """One call of the chunk-`t` program: `input_ids` [max_batch, t] with each row's `fed` [max_batch] real
        tokens last (the rest is filler); returns the logits of each row's last column [r, vocab] for the rows
        ``0 .. r-1`` the call computed (``r = max_batch`` unless a row bucket holds every fed row).

        The callers keep every row within ``max_length`` (``prefill`` checks
        it; ``generate`` and the session refuse a request that could pass it),
        so no call reads a length back from the device.
        """
        lengths = self.lengths
        new_lengths = lengths + fed
        # column j of a row fed k tokens: real token at slot n + (j - (t - k)) for j >= t - k, filler at n + j + k
        pos = lengths[:, None] + (self._cols[t][None, :] - (t - fed)[:, None]) % t
        program, context, r = self.steps.for_call(t, self._longest(new_lengths), self._fed_rows(t, fed))
        mask = self._slots[None, :context] < new_lengths[:, None]
        if r < self.spec.max_batch:  # rows r.. are not fed: their lengths stay, their slots are not written
            input_ids, pos, mask = input_ids[:r], pos[:r], mask[:r]
        out = program(input_ids, pos, mask, *self.state)
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
            fed = torch.zeros(b, dtype=torch.int64, device=self.device)
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

    def decode(self, tokens: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Feed `tokens` [max_batch] to the `active` [max_batch] bool rows; logits [max_batch, vocab]."""
        ids = torch.where(active, tokens, self.spec.filler_token)[:, None]
        return self.run(1, ids, active.to(torch.int64))


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
    eos = torch.tensor(s.eos_token_id, device=dev) if s.eos_token_id else None
    unfinished = torch.ones(batch, dtype=torch.bool, device=dev)
    new: list[torch.Tensor] = []
    tokens = torch.full((spec.max_batch,), spec.filler_token, dtype=torch.int64, device=dev)
    active = torch.zeros(spec.max_batch, dtype=torch.bool, device=dev)
    for step in range(max_new_tokens):
        # a finished row's scores are set to 0: the draws of the others are those of transformers' [batch, vocab] call
        nxt = choose(torch.where(unfinished[:, None], logits.float(), 0.0), s, generator)
        if eos is not None:
            nxt = torch.where(unfinished, nxt, s.pad_token_id)
            unfinished = unfinished & ~torch.isin(nxt, eos)
        new.append(nxt)
        if step == max_new_tokens - 1 or not bool(unfinished.any()):
            break
        tokens[:batch], active[:batch] = nxt, unfinished
        logits = engine.decode(tokens, active)[:batch]
    return torch.cat([input_ids.to(dev), torch.stack(new, dim=1).to(input_ids.dtype)], dim=1)


__all__ = ["Engine", "Program", "StateSpec", "StepPrograms", "StepSpec", "check_state", "generate", "is_jax_array",
           "new_state", "prompt_rows"]
