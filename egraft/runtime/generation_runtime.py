"""The generation runtime a compiled and a loaded generation both run: programs, caches, generate, session.

``egraft.compile(llm, max_batch=, max_length=)`` (``api.generation.Generation``,
which adds what compiling took) and ``egraft.load`` of a saved generation
(``runtime.generation_artifact.GenerationArtifact``, which adds the
directory) each hold one :class:`GenerationRuntime`; each bucket's program
comes from the one adapter ``runtime.step_program.step_program``.  Light:
only torch and numpy.
"""

from __future__ import annotations

import threading
from typing import Callable

import torch

from .generation import StepPrograms, generate, new_state
from .slots import Session


class GenerationRuntime:
    """The generation runtime ``egraft.compile(llm, max_batch=, max_length=)`` and ``egraft.load`` both return
    under their facades: the step programs, their caches (made once on `device`, updated in place by every
    call), ``generate`` (one call at a time: one set of caches) and ``session()`` (requests from several threads
    sharing the rows, over caches of its own).

    `check`: called before each ``generate`` and ``session`` (a compiled
    generation refuses to run once its model's weights changed in place).
    """

    def __init__(self, programs: StepPrograms, device: str = "cpu", check: Callable[[], None] | None = None):
        self.spec, self.programs, self.device = programs.spec, programs, device
        self.state = new_state(programs.spec, device)
        self._check = check
        self._lock = threading.Lock()

    def generate(self, input_ids, attention_mask=None, **options) -> torch.Tensor:
        """transformers' ``generate`` arguments and output (:func:`generate`) on the runtime's caches."""
        if self._check is not None:
            self._check()
        with self._lock:
            return generate(self.programs, self.state, input_ids, attention_mask, **options)

    def session(self):
        """A :class:`~egraft.runtime.slots.Session` over fresh caches: requests from several threads share the rows."""
        if self._check is not None:
            self._check()
        return Session(self.programs, device=self.device)


class RunsGeneration:
    """What a compiled and a loaded generation both offer, handed on to their ``runtime`` (the one
    :class:`GenerationRuntime`): the caches, ``generate`` and ``session``."""

    runtime: GenerationRuntime

    @property
    def state(self) -> list:
        """The caches ``generate`` runs on (a list updated in place: the runtime's).  A JAX step keeps them as jax
        arrays between calls, a bfloat16 or float16 cache as its bits (``int16``, the same bytes)."""
        return self.runtime.state

    def generate(self, input_ids, attention_mask=None, **options) -> torch.Tensor:
        """transformers' ``generate`` arguments and output (``runtime.generation.generate``); one call at a time."""
        return self.runtime.generate(input_ids, attention_mask, **options)

    def session(self) -> Session:
        """A :class:`~egraft.runtime.slots.Session` over fresh caches: requests from several threads share the rows."""
        return self.runtime.session()


__all__ = ["GenerationRuntime", "RunsGeneration"]
