"""Many sequences sharing one step's cache rows: a session with one worker thread driving the steps.

::

    with Session(programs) as s:                      # programs: a StepPrograms (eager or compiled)
        fut = s.submit(prompt_ids, max_new_tokens=32)  # from any thread; a concurrent.futures.Future
        tokens = fut.result()                          # int64 [len(prompt) + new]: prompt, then its tokens

Each request takes a free cache row (of ``max_batch``), joins with its prompt
fed in ladder chunks while the other rows wait (they write filler beyond
their lengths, so they are left as they were), then decodes one token per
step alongside the others, and leaves at its own eos or ``max_new_tokens``;
its row goes to the next waiting request.  Rows never read each other's
slots, and each request samples with its own generator (``seed=`` or
``generator=``), so a request gets the tokens it would get alone:
``generate(programs, None, prompt[None], ...)`` with that generator, or
transformers' ``generate`` after ``torch.manual_seed(seed)``.

A request that cannot run (too long, bad options) is refused by ``submit``
in the caller's thread, before it starts; the others keep running.  One
lock guards the queue; only the worker thread touches the engine.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import MutableSequence

import torch

from ..errors import InputError
from .generation import Engine, StepPrograms, check_request
from .sampling import UNSET, Sampling, choose


@dataclass
class _Request:
    prompt: torch.Tensor
    max_new_tokens: int
    sampling: Sampling
    generator: torch.Generator | None
    future: Future
    row: int = -1
    logits: torch.Tensor | None = None
    new: list = field(default_factory=list)


class Session:
    """Requests from any thread, run together on one step's cache rows by one worker thread (see the module)."""

    def __init__(self, programs: StepPrograms, state: MutableSequence[torch.Tensor] | None = None, device=None):
        self.spec = programs.spec
        self._engine = Engine(programs, state, device)
        self._cond = threading.Condition(threading.Lock())
        self._pending: deque[_Request] = deque()
        self._running: dict[int, _Request] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="egraft-generation-session", daemon=True)
        self._thread.start()

    # --- the callers' side ---------------------------------------------------------------------------

    def submit(self, prompt, *, max_new_tokens: int, do_sample=UNSET, temperature=UNSET, top_k=UNSET, top_p=UNSET,
               eos_token_id=UNSET, pad_token_id=UNSET, seed: int | None = None,
               generator: torch.Generator | None = None) -> Future:
        """Queue one sequence (`prompt`: token ids, 1-D); a Future of int64 [len(prompt) + new tokens].

        Options as :func:`~egraft.runtime.generation.generate`; `seed` makes the
        request's own generator (``torch.Generator().manual_seed(seed)``).
        Raises InputError at once when the request cannot run.
        """
        spec = self.spec
        s = spec.defaults.with_(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                                eos_token_id=eos_token_id, pad_token_id=pad_token_id)
        p = torch.as_tensor(prompt)
        if p.ndim == 2 and p.shape[0] == 1:
            p = p[0]
        if p.ndim != 1 or p.dtype not in (torch.int64, torch.int32) or not len(p):
            raise InputError(f"a prompt is a non-empty 1-D tensor of token ids, got {p.dtype} {list(p.shape)}")
        check_request(spec, len(p), max_new_tokens)
        if seed is not None and generator is not None:
            raise InputError("pass seed= or generator=, not both")
        if seed is not None:
            generator = torch.Generator(device=self._engine.device).manual_seed(int(seed))
        req = _Request(p.to(self._engine.device, torch.int64), max_new_tokens, s, generator, Future())
        with self._cond:
            if self._closed:
                raise InputError("the session is closed: make a new Session")
            self._pending.append(req)
            self._cond.notify()
        return req.future

    @property
    def calls(self) -> int:
        """Program calls made so far (prefill chunks and decode steps)."""
        return self._engine.calls

    def generate(self, prompt, **options) -> torch.Tensor:
        """``submit(prompt, **options).result()``."""
        return self.submit(prompt, **options).result()

    def close(self, wait: bool = True) -> None:
        """Take no more requests; the queued and running ones finish (joined when `wait`)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if wait:
            self._thread.join()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the worker ----------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._running and not self._closed:
                    self._cond.wait()
                if self._closed and not self._pending and not self._running:
                    return
                joining = self._admit()
            try:
                self._step(joining)
            except Exception as e:  # a failed call fails the requests it carried; the session goes on
                for req in list(self._running.values()):
                    self._finish(req, error=e)

    def _admit(self) -> list[_Request]:
        free = [r for r in range(self.spec.max_batch) if r not in self._running]
        joining = []
        while self._pending and free:
            req = self._pending.popleft()
            if not req.future.set_running_or_notify_cancel():
                continue
            req.row = free.pop(0)
            self._running[req.row] = req
            joining.append(req)
        return joining

    def _step(self, joining: list[_Request]) -> None:
        eng, spec = self._engine, self.spec
        if joining:  # the others wait: their rows are fed filler beyond their lengths
            logits = eng.prefill({r.row: r.prompt for r in joining})
            for r in joining:
                r.logits = logits[r.row]
        tokens = torch.full((spec.max_batch,), spec.filler_token, dtype=torch.int64, device=eng.device)
        active = torch.zeros(spec.max_batch, dtype=torch.bool, device=eng.device)
        running = list(self._running.values())
        greedy = [r for r in running if not r.sampling.do_sample]
        picked = {}
        if greedy:  # one argmax for every greedy row; each sampled row draws from its own generator
            rows = choose(torch.stack([r.logits for r in greedy]), greedy[0].sampling).tolist()
            picked = {id(r): t for r, t in zip(greedy, rows)}
        for req in running:
            tok = picked[id(req)] if id(req) in picked else int(choose(req.logits[None], req.sampling, req.generator)[0])
            req.new.append(tok)
            eos = req.sampling.eos_token_id or ()
            if tok in eos or len(req.new) == req.max_new_tokens:
                self._finish(req)
            else:
                tokens[req.row], active[req.row] = tok, True
        if self._running:
            logits = eng.decode(tokens, active)
            for req in self._running.values():
                req.logits = logits[req.row]

    def _finish(self, req: _Request, error: BaseException | None = None) -> None:
        self._running.pop(req.row, None)
        self._engine.free(req.row)
        if error is not None:
            req.future.set_exception(error)
        else:
            new = torch.tensor(req.new, dtype=torch.int64, device=req.prompt.device)
            req.future.set_result(torch.cat([req.prompt, new]))


__all__ = ["Session"]
