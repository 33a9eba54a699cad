"""The options of the ``egraft`` torch.compile backend, checked once.

``torch.compile(model, backend="egraft", options={...})`` hands the dict to
the backend as its ``options`` keyword (torch passes ``options`` and
``mode`` only when they are set).  Serving engines read their compilation
settings from JSON or command lines, so every option also has a plain-data
form: the budget may be a number of seconds, a ``"20s"`` string or a dict of
:class:`egraft.search.Budget` fields.  A misspelt option is an error naming
the known ones, never silently ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..errors import InputError

# Options for callers that cannot pass torch.compile options (a serving engine that takes only a
# backend name): a JSON object, overridden key by key by the options passed in.
ENV_VAR = "EGRAFT_DYNAMO_OPTIONS"

# A torch.compile call blocks the first forward pass, so the default search is short; the search
# cache makes the next compile of the same graph return at once.
DEFAULT_BUDGET = "10s"


@dataclass(frozen=True)
class Options:
    """What the backend searches with.

    budget      search budget per graph (seconds, ``"20s"``, a Budget or a dict of its fields);
                a graph split around unsupported ops shares it among its pieces
    device      ``"cpu"``, ``"cuda"``, ``"cuda:N"``; default: the device of the graph's inputs
    backend     egraft backend (``"auto"``, ``"jax"``, ``"torch"``, ``"triton"``)
    fitness     ``"measured"`` (time candidates) or ``"model"`` (the cost model; no timing)
    limits      equality-saturation limits (an ``egraft.rewrites.Limits`` or a dict of its fields, e.g.
                ``{"iterations": 2, "seconds": 5}``); default: the search's own
    seed        the search's seed
    cache       use the on-disk search cache
    validate    compare each compiled graph with PyTorch on its first inputs; a mismatch warns and
                runs that graph in PyTorch
    max_shapes  compiled shape signatures kept per graph (dynamic shapes are specialised per
                signature); beyond it new shapes run in PyTorch, with one warning
    progress    show the search's progress bar
    """

    budget: Any = DEFAULT_BUDGET
    device: str | None = None
    backend: str = "auto"
    fitness: str | None = None
    limits: Any = None
    seed: int = 0
    cache: bool = True
    validate: bool = True
    max_shapes: int = 8
    progress: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None = None, mode: str | None = None) -> "Options":
        """Options from torch.compile's ``options`` dict over those in ``$EGRAFT_DYNAMO_OPTIONS``.

        ``mode`` is an Inductor setting egraft does not use: anything but the
        default is an error rather than silently ignored.
        """
        if mode not in (None, "default"):
            raise InputError(f"torch.compile mode={mode!r} is an Inductor setting; the egraft backend takes "
                             "options={'budget': ..., 'fitness': ...} instead")
        options = {**_from_env(), **dict(options or {})}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InputError(f"unknown egraft backend option(s) {', '.join(map(repr, unknown))}; "
                             f"the options are {', '.join(sorted(known))}")
        opts = cls(**options)
        if opts.fitness not in (None, "measured", "model"):
            raise InputError(f"fitness must be 'measured' or 'model', got {opts.fitness!r}")
        if not isinstance(opts.max_shapes, int) or opts.max_shapes < 1:
            raise InputError(f"max_shapes must be a positive integer, got {opts.max_shapes!r}")
        opts.search_budget()  # a malformed budget or limits fail here, at torch.compile time
        opts.rewrite_limits()
        return opts

    def rewrite_limits(self):
        """The saturation limits as an :class:`egraft.rewrites.Limits` (None: the search's defaults)."""
        from ..rewrites import Limits

        if self.limits is None or isinstance(self.limits, Limits):
            return self.limits
        if not isinstance(self.limits, Mapping):
            raise InputError(f"limits must be a dict of egraft.rewrites.Limits fields, got {self.limits!r}")
        try:
            return Limits(**self.limits)
        except TypeError as e:
            raise InputError(f"limits {dict(self.limits)!r}: {e}; its keys are "
                             f"{', '.join(f.name for f in fields(Limits))}") from None

    def search_budget(self, share: float = 1.0):
        """The budget as an :class:`egraft.search.Budget`, scaled to ``share`` of it."""
        from ..search import Budget

        b = self.budget
        if isinstance(b, Mapping):
            try:
                b = Budget(**b)
            except TypeError as e:
                raise InputError(f"budget dict {dict(b)!r}: {e}; its keys are "
                                 f"{', '.join(f.name for f in fields(Budget))}") from None
        try:
            plan = Budget.of(b)
        except ValueError as e:
            raise InputError(str(e)) from None
        return plan if share >= 1.0 else plan.share(share)


def _from_env() -> dict:
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"${ENV_VAR} is not valid JSON ({e}); write e.g. '{{\"budget\": \"30s\"}}'") from None
    if not isinstance(value, dict):
        raise InputError(f"${ENV_VAR} must be a JSON object of backend options, got {text!r}")
    return value
