"""Generation over a KV cache held as state: each step is one call of one program.

The step's contract (a program's calling convention, the cache layout, the
buckets) is :mod:`egraft.runtime.step_spec`'s; its names are re-exported
here.  This module runs it: :class:`Engine` keeps the caches and each row's
length and makes one program call per chunk (a prompt in ladder chunks, a
decode step as the chunk of size 1); :func:`generate` is transformers'
``model.generate`` on top of it (one group of ``runtime.decode``, the one
decode loop).  Light: only torch and numpy, never transformers or the
compiler.
"""

from __future__ import annotations

from typing import Mapping, MutableSequence

import numpy as np
import torch

from ..errors import InputError
from .decode import Decoder, Group
from .sampling import UNSET, Sampling
from .step_spec import (Bucket, StepProgram, StateSpec, StepPrograms, StepSpec, check_state, is_jax_array,
                        new_state)


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
        # the longest prompt's plan (StepSpec.plan); each chunk feeds every row what it has left, up to its size
        for t in spec.plan(max((len(p) for p in left.values()), default=0)):
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
    ids = input_ids.to(device=engine.device, dtype=torch.int64)
    group = Group([ids[r, ids.shape[1] - n[r]:] for r in range(batch)], max_new_tokens, s, generator, first=0)
    decoder = Decoder(engine)
    decoder.join([group])
    while decoder.groups:
        decoder.step()
    out = torch.from_numpy(group.tokens()).to(device=input_ids.device, dtype=input_ids.dtype)
    return torch.cat([input_ids, out], dim=1)  # on the prompt's device, as transformers' generate


__all__ = ["Bucket", "Engine", "StateSpec", "StepProgram", "StepPrograms", "StepSpec",
           "check_state", "generate", "is_jax_array", "new_state", "prompt_rows"]
