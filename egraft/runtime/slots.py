"""Many sequences sharing one step's cache rows: a session with one worker thread driving the steps.

::

    with Session(programs) as s:                      # programs: a StepPrograms (eager or compiled)
        fut = s.submit(prompt_ids, max_new_tokens=32)  # from any thread; a concurrent.futures.Future
        tokens = fut.result()                          # int64 [len(prompt) + new]: prompt, then its tokens

Each request takes a free cache row (of ``max_batch``), joins with its prompt
fed in ladder chunks while the other rows wait (they write filler beyond
their lengths, so they are left as they were), then decodes one token per
step alongside the others, and leaves at its own eos or ``max_new_tokens``;
its row goes to the next waiting request.  The decode loop is
``runtime.decode``'s, which ``generate`` runs too: a request is a group of
one row there.  Rows never read each other's
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
from dataclasses import dataclass
from typing import MutableSequence

import torch

from ..errors import InputError
from .decode import Decoder, Group
from .generation import Engine, StepPrograms, check_request
from .sampling import UNSET


@dataclass(eq=False)
class _Request:
    group: Group  # one row: runtime.decode's group of one sequence
    future: Future


class Session:
    """Requests from any thread, run together on one step's cache rows by one worker thread (see the module)."""

    def __init__(self, programs: StepPrograms, state: MutableSequence[torch.Tensor] | None = None, device=None):
        self.spec = programs.spec
        self._engine = Engine(programs, state, device)
        self._decoder = Decoder(self._engine)
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
        req = _Request(Group([p.to(self._engine.device, torch.int64)], max_new_tokens, s, generator), Future())
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
            req.group.first = free.pop(0)
            self._running[req.group.first] = req
            joining.append(req)
        return joining

    def _step(self, joining: list[_Request]) -> None:
        """The joining requests' prompts fed (the others wait: their rows are fed filler beyond their lengths),
        then one decode step of every running request (``runtime.decode.Decoder``)."""
        if joining:
            self._decoder.join([r.group for r in joining])
        for g in self._decoder.step():
            self._finish(self._running[g.first])

    def _finish(self, req: _Request, error: BaseException | None = None) -> None:
        self._decoder.leave(req.group)
        self._running.pop(req.group.first, None)
        if error is not None:
            req.future.set_exception(error)
        else:
            prompt = req.group.prompts[0]
            new = torch.from_numpy(req.group.tokens()[0]).to(prompt.device)
            req.future.set_result(torch.cat([prompt, new]))


__all__ = ["Session"]
