"""Errors a user of egraft can act on.

Every error names what was wrong and what to do about it.  All derive from
:class:`EgraftError`, so callers can catch the whole family at once.
"""

from __future__ import annotations


class EgraftError(Exception):
    """Base class of every error egraft raises on purpose."""


class IRError(EgraftError):
    """An IR graph or node is malformed (bad arity, shape, dtype or attribute)."""


class InputError(EgraftError):
    """Inputs handed to a graph or executable do not match what it expects."""


class UnsupportedOpError(EgraftError):
    """A model uses an operator egraft cannot lower (yet).

    Carries the operator name and, where known, the model source line it came
    from, so the message can point the user at the exact place to change.
    """

    def __init__(self, op: str, source: str | None = None, hint: str | None = None):
        self.op = op
        self.source = source
        where = f"\n  at: {source}" if source else ""
        todo = hint or (
            "Replace it in the model with supported operations, run that part "
            "outside the compiled region, or add a lowering rule to "
            "egraft/frontend/lowering/ (one entry per ATen op)."
        )
        super().__init__(f"egraft cannot lower operator '{op}'.{where}\n  what to do: {todo}")


class TraceError(EgraftError):
    """torch.export could not capture the model."""


class SaturationError(EgraftError):
    """Equality saturation failed (for example, conflicting shape facts)."""


class BackendError(EgraftError):
    """A backend could not lower or run a graph."""


class SearchError(EgraftError):
    """A search could not run: no backend runs on the device, or the model's own program fails there."""


class ArtifactError(EgraftError):
    """A saved artifact is missing, corrupt or from an incompatible version."""


class ValidationError(BackendError):
    """A compiled program disagrees with the model it was compiled from; it is never handed out."""
