"""Choosing the next token from a step's logits, as Hugging Face ``generate`` does.

The order and arithmetic are transformers' (``generation/utils.py`` ``_sample`` and
``generation/logits_process.py``): the logits are copied to float32; when
sampling, the warpers run in the order ``_get_logits_processor`` appends them
(temperature when it is not 1.0, top-k when it is set and not 0, top-p when it
is below 1.0), each with ``min_tokens_to_keep=1``; then
``torch.multinomial(softmax(scores), 1)`` draws the token (greedy: ``argmax``).
So with the same seed and the same logits, the same tokens come out.

:class:`Sampling` holds one request's settings as plain values (the defaults a
model's ``generation_config`` gives were read when the step was built, in the
frontend; this module never imports transformers).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..errors import InputError



class _Unset:
    def __repr__(self):
        return "UNSET"


UNSET = _Unset()  # an option a call leaves to the defaults (None is a value: it turns the option off, as in transformers)
_OFF = {"do_sample": False, "temperature": 1.0, "top_k": None, "top_p": 1.0}  # what an explicit None means


@dataclass(frozen=True)
class Sampling:
    """How one request picks tokens: transformers' ``do_sample``, ``temperature``, ``top_k``, ``top_p``,
    ``eos_token_id`` (a tuple: a row stops at any of them) and ``pad_token_id`` (what a finished row gets)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = 50
    top_p: float = 1.0
    eos_token_id: tuple[int, ...] | None = None
    pad_token_id: int | None = None

    def with_(self, **overrides) -> "Sampling":
        """A copy with each override that is not :data:`UNSET` applied, then checked.

        As in transformers' ``generate``, an explicit None turns an option off
        (``eos_token_id=None``: no eos; ``top_k=None``: no top-k filtering)
        and ``pad_token_id`` falls back to the first eos token when neither
        the defaults nor the call set one.
        """
        given = {k: (_OFF.get(k) if v is None else v) for k, v in overrides.items() if v is not UNSET}
        unknown = sorted(set(given) - set(self.__dataclass_fields__))
        if unknown:
            raise InputError(f"unknown generation option(s) {unknown}; the options are "
                             f"{sorted(self.__dataclass_fields__)}")
        if "eos_token_id" in given:
            given["eos_token_id"] = eos_tuple(given["eos_token_id"])
        out = replace(self, **given)
        if out.pad_token_id is None and out.eos_token_id:
            out = replace(out, pad_token_id=out.eos_token_id[0])
        out.check()
        return out

    def check(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not t > 0:
            raise InputError(f"temperature={t!r}: it must be a number > 0 (for greedy decoding pass do_sample=False)")
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
            raise InputError(f"top_k={k!r}: it must be an int >= 0 (0 or None: no top-k filtering)")
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
            raise InputError(f"top_p={p!r}: it must be a float in [0, 1] (1.0: no top-p filtering)")
        if self.pad_token_id is not None and (not isinstance(self.pad_token_id, int) or self.pad_token_id < 0):
            raise InputError(f"pad_token_id={self.pad_token_id!r}: it must be a token id (an int >= 0)")


def eos_tuple(eos) -> tuple[int, ...] | None:
    """An eos setting (None, an int, a sequence of ints, a tensor) as a tuple of ints (None when unset)."""
    if eos is None:
        return None
    if isinstance(eos, torch.Tensor):
        eos = eos.reshape(-1).tolist()
    elif isinstance(eos, int):
        eos = [eos]
    eos = tuple(eos)
    if not eos or not all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in eos):
        raise InputError(f"eos_token_id={eos!r}: it must be a token id or a non-empty list of token ids (ints >= 0)")
    return eos


def warp(scores: torch.Tensor, s: Sampling) -> torch.Tensor:
    """transformers' sampling warpers on float32 `scores` [rows, vocab], in its order (a no-op when greedy)."""
    if not s.do_sample:
        return scores
    if s.temperature != 1.0:  # TemperatureLogitsWarper
        scores = scores / float(s.temperature)
    if s.top_k:  # TopKLogitsWarper(top_k, min_tokens_to_keep=1)
        k = min(max(s.top_k, 1), scores.size(-1))
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -float("inf"))
    if s.top_p < 1.0:  # TopPLogitsWarper(top_p, min_tokens_to_keep=1)
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - float(s.top_p))
        remove[..., -1:] = 0
        scores = scores.masked_fill(remove.scatter(1, sorted_indices, remove), -float("inf"))
    return scores


def choose(logits: torch.Tensor, s: Sampling, generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token of each row of `logits` [rows, vocab] (int64 [rows]): argmax, or one draw after `warp`."""
    if not s.do_sample:  # the first of equal maxima, as transformers' argmax (float32 holds every lower precision)
        return torch.argmax(logits, dim=-1)
    scores = logits.to(dtype=torch.float32, copy=True)
    probs = torch.nn.functional.softmax(warp(scores, s), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


__all__ = ["UNSET", "Sampling", "choose", "eos_tuple", "warp"]
