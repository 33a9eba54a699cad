"""One compile configuration, parsed once: ``CompileConfig``.

Every entry point (``egraft.compile``, the ``egraft compile`` command line,
the ``torch.compile`` backend's ``options`` and ``$EGRAFT_DYNAMO_OPTIONS``)
turns what it was given into one frozen :class:`CompileConfig` through
:meth:`CompileConfig.parse`; the search, the pipeline and the cache read
that value and nothing else.  A misspelt option is one error naming the
known ones, whatever the entry point.

What a search result depends on is :meth:`CompileConfig.identity`: device,
backend request, fitness, the rule set (by the rules' own text, so editing
a rule changes it), the saturation limits, the seed and whether repeated
layers are searched once.  The search cache keys on it together with the
program and the library versions (:mod:`egraft.search.stored`); the budget
is not part of the identity but is stored beside a cached result, which
answers a request only when its budget :meth:`Budget.covers` the one asked
for (a result from a smaller budget joins a larger search's final
comparison, never answers it).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping

from ..errors import InputError

FITNESSES = (None, "measured", "model")
# Options for callers that cannot pass options themselves (a serving engine that takes only a backend
# name): a JSON object, overridden key by key by the options passed in.
ENV_VAR = "EGRAFT_DYNAMO_OPTIONS"


@dataclass(frozen=True)
class Budget:
    """When to stop: wall seconds, distinct candidates evaluated, generations (None: no limit).

    The seconds are the whole compile's when ``started`` says when it began
    (``time.perf_counter()``; set by ``egraft.compile`` before tracing): the
    search then counts what came before it, and keeps out of its share about
    one whole-program compile and check for each of the ``after`` programs
    that follow it (the other sizes of a generation).  Neither changes how
    hard a search looks (:meth:`covers`).
    """

    seconds: float | None = 30.0
    trials: int | None = None
    generations: int | None = None
    population: int = 12
    patience: int = 3
    after: int = 0
    started: float | None = None

    @classmethod
    def of(cls, budget) -> "Budget":
        """A Budget from None (defaults), a number of seconds, a ``"60s"`` / ``"2m"`` string, a dict of
        its fields, or a Budget."""
        if budget is None:
            return cls()
        if isinstance(budget, Budget):
            return budget
        if isinstance(budget, Mapping):
            try:
                return cls(**budget)
            except TypeError as e:
                raise ValueError(f"budget dict {dict(budget)!r}: {e}; its keys are "
                                 f"{', '.join(f.name for f in fields(cls))}") from None
        if isinstance(budget, str):
            text = budget.strip().lower()
            scale = 60.0 if text.endswith("m") else 1.0
            try:
                seconds = float(text.rstrip("sm")) * scale
            except ValueError:
                raise ValueError(f"budget {budget!r} is not a duration; write e.g. 60, '60s' or '2m'") from None
            if seconds > 0:
                return cls(seconds=seconds)
        if isinstance(budget, (int, float)) and not isinstance(budget, bool) and budget > 0:
            return cls(seconds=float(budget))
        raise ValueError(f"budget must be a positive number of seconds, a string like '60s', a dict of Budget "
                         f"fields or a Budget; got {budget!r}")

    def share(self, fraction: float) -> "Budget":
        f = max(min(fraction, 1.0), 0.0)
        return Budget(None if self.seconds is None else self.seconds * f,
                      None if self.trials is None else max(1, round(self.trials * f)),
                      self.generations, self.population, self.patience)

    def effort(self) -> dict:
        """The fields that say how hard a search looks (what a report and the search cache record)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("after", "started")}

    def covers(self, other: "Budget") -> bool:
        """True when a search under this budget looked at least as hard as one under `other`.

        Hardness is the effort limits (seconds, trials, generations: each at
        least as large, None being no limit) and the patience (a more patient
        search stops later).  The population shapes a search, not its size:
        the same trials spread over other generations are the same effort.
        """
        def ge(a, b):  # None is "no limit": larger than any number
            return a is None or (b is not None and a >= b)

        return (ge(self.seconds, other.seconds) and ge(self.trials, other.trials)
                and ge(self.generations, other.generations) and self.patience >= other.patience)


@dataclass(frozen=True)
class CompileConfig:
    """Everything a compile is asked for, checked once (see the module docstring).

    device      ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"tpu"``; None: the device of the inputs (Dynamo)
    backend     ``"auto"`` (the search picks among the backends that run on the device) or a backend name
    budget      search budget per signature (:class:`Budget`; parsed from seconds, ``"20s"``, ``"2m"`` or a dict)
    fitness     ``"measured"`` (time candidates), ``"model"`` (the cost model), None (measured where possible)
    rules       rule families or rule names to saturate with (None: every registered rule)
    limits      saturation limits (an ``egraft.rewrites.Limits`` or a dict of its fields); None: the defaults
    seed        the search's seed
    cache       True (the default on-disk cache), False, or an ``egraft.search.cache.Cache``
    validate    check each compiled program against the model before it is used
    max_shapes  compiled shape signatures kept per model or graph; beyond it new shapes run in PyTorch
                (Dynamo) or are an error (``egraft.compile``), with one clear message
    dynamic     a size Dynamo made dynamic (Dynamo): ``"buckets"`` pads it to a few compiled sizes (1, 2, 4, 8,
                then every 8 to 256, every 16 beyond) where egraft proves its rows independent, else runs the
                graph in PyTorch; a list of sizes is that ladder; ``"per_size"`` compiles each size on its own
                (up to ``max_shapes``)
    progress    None (a progress bar on a terminal), True or False
    reuse_layers  search each distinct repeated block once and reuse its winner (False: one whole-graph search)
    state_in_place  for a graph with state and backend ``"auto"``, search only the backends that write the
                caller's state tensors in place (``egraft.backends.candidates``; the Dynamo backend's default,
                so a static KV cache is not copied on every decode step)
    weight_copies  False (the default): every product reads its weight where the model stores it
                (``Backend.copy_free``): one copy of the weights in memory; True: a backend may also keep a
                weight in another layout (the JAX backend's column panels, a second copy of each product's
                weight, made once and shared by every program) where the search finds it faster
    """

    device: str | None = "cpu"
    backend: str = "auto"
    budget: Budget = field(default_factory=Budget)  # parse() and with_() also take seconds, "20s", a dict
    fitness: str | None = None
    rules: tuple[str, ...] | None = None
    limits: Any = None  # egraft.rewrites.Limits | None
    seed: int = 0
    cache: Any = True
    validate: bool = True
    max_shapes: int = 8
    dynamic: Any = "buckets"
    progress: bool | None = None
    reuse_layers: bool = True
    state_in_place: bool = False
    weight_copies: bool = False

    # --- parsing -------------------------------------------------------------------------------

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None = None, *, env: bool = False, where: str = "egraft",
              defaults: Mapping[str, Any] | None = None, **overrides) -> "CompileConfig":
        """A checked config from `options` (and keyword `overrides` over them).

        With ``env=True`` the JSON object in ``$EGRAFT_DYNAMO_OPTIONS`` is read
        first and overridden key by key.  `defaults` are an entry point's own
        defaults, under everything else (the Dynamo backend's shorter budget).
        `where` names the entry point in error messages (``"egraft.compile"``,
        ``"the egraft torch.compile backend"``, ``"egraft compile"``).
        """
        given = {**dict(defaults or {}), **(_from_env() if env else {}), **dict(options or {}), **overrides}
        _refuse_unknown(given, where)
        return cls(**given)._checked(where)

    def _checked(self, where: str) -> "CompileConfig":
        if self.fitness not in FITNESSES:
            raise InputError(f"{where}: fitness must be 'measured' or 'model', got {self.fitness!r}")
        if self.device is not None:
            from ..measure import parse as parse_device

            try:
                dev = str(parse_device(self.device))
            except Exception as e:  # noqa: BLE001 - the parser's own error names the forms
                raise InputError(f"{where}: {e}") from None
        else:
            dev = None
        if not isinstance(self.backend, str):
            raise InputError(f"{where}: backend must be a name ('auto', 'jax', 'torch', 'triton', ...), "
                             f"got {self.backend!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise InputError(f"{where}: seed must be an integer, got {self.seed!r}")
        if not isinstance(self.max_shapes, int) or isinstance(self.max_shapes, bool) or self.max_shapes < 1:
            raise InputError(f"{where}: max_shapes must be a positive integer, got {self.max_shapes!r}")
        dynamic = self.dynamic
        if isinstance(dynamic, (list, tuple)):
            if not dynamic or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in dynamic):
                raise InputError(f"{where}: dynamic sizes must be positive integers, got {dynamic!r}")
            dynamic = tuple(sorted(set(dynamic)))
        elif dynamic not in ("buckets", "per_size"):
            raise InputError(f"{where}: dynamic must be 'buckets', 'per_size' or a list of sizes, got {dynamic!r}")
        if self.progress not in (None, True, False):
            raise InputError(f"{where}: progress must be True, False or None, got {self.progress!r}")
        if not isinstance(self.state_in_place, bool):
            raise InputError(f"{where}: state_in_place must be True or False, got {self.state_in_place!r}")
        if not isinstance(self.reuse_layers, bool):
            raise InputError(f"{where}: reuse_layers must be True or False, got {self.reuse_layers!r}")
        if not isinstance(self.weight_copies, bool):
            raise InputError(f"{where}: weight_copies must be True or False, got {self.weight_copies!r}")
        budget = self.budget
        if not isinstance(budget, Budget):
            try:
                budget = Budget.of(budget)
            except ValueError as e:
                raise InputError(f"{where}: {e}") from None
        rules = self.rules
        if rules is not None:
            if isinstance(rules, str):
                rules = (rules,)
            rules = tuple(str(r) for r in rules)
        return replace(self, device=dev, budget=budget, rules=rules, limits=_limits(self.limits, where),
                       dynamic=dynamic)

    def with_(self, where: str = "egraft", **changes) -> "CompileConfig":
        """A copy with some fields changed (parsed as :meth:`parse` parses them), checked again."""
        _refuse_unknown(changes, where)
        return replace(self, **changes)._checked(where)

    # --- how many sizes ---------------------------------------------------------------------------

    def no_room(self, compiled, key, what: str) -> str | None:
        """The one ``max_shapes`` policy: why `key` cannot be compiled beside the `compiled` ones (a container of
        keys), or None when it can (it is among them, or there is room).  Each caller acts on the reason its
        own way: ``egraft.compile`` raises it, the Dynamo backend runs the call in PyTorch and says so.
        `what` names the compiled things (``"input shapes"``, ``"bucket sizes"``)."""
        if key in compiled or len(compiled) < self.max_shapes:
            return None
        return f"compiled for {len(compiled)} {what} already (the max_shapes option, {self.max_shapes})"

    # --- what a result depends on ----------------------------------------------------------------

    def rule_specs(self):
        """The rules to saturate with (``RuleSpec`` list): every registered rule, or the families/names asked."""
        from ..rewrites import all_rules

        every = all_rules()
        if self.rules is None:
            return every
        chosen = [r for r in every if r.name in self.rules or r.family in self.rules]
        missing = sorted(set(self.rules) - {r.name for r in chosen} - {r.family for r in chosen})
        if missing:
            families = sorted({r.family for r in every})
            raise InputError(f"unknown rule or rule family {', '.join(map(repr, missing))}; the families are "
                             f"{', '.join(families)} (or name single rules, e.g. 'algebra.sin-odd')")
        return chosen

    def rules_digest(self) -> str:
        """A hash of the chosen rules' names and bodies (egglog text or the procedure's code)."""
        h = hashlib.sha256()
        for r in self.rule_specs():
            h.update(r.name.encode())
            if r.egglog is not None:
                h.update(r.egglog.encode())
            else:
                code = getattr(r.apply, "__code__", None)
                if code is None:
                    h.update(repr(r.apply).encode())
                else:
                    _hash_code(h, code)
        return h.hexdigest()[:16]

    def identity(self) -> dict:
        """The fields a search result depends on, budget excepted (module docstring), as plain JSON."""
        from .cache import device_id

        limits = self.limits
        return {
            "device": device_id(self.device or "cpu"),
            "backend": self.backend,
            "fitness": self.fitness,
            "rules": self.rules_digest(),
            "limits": None if limits is None else asdict(limits),
            "seed": self.seed,
            "reuse_layers": self.reuse_layers,
            **({"state_in_place": True} if self.state_in_place else {}),  # absent when off: older keys still hit
            **({"weight_copies": False} if not self.weight_copies else {}),
        }


def _refuse_unknown(given: Mapping[str, Any], where: str) -> None:
    """The one error for an option `CompileConfig` does not have, naming those it has."""
    known = [f.name for f in fields(CompileConfig)]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise InputError(f"{where}: unknown option(s) {', '.join(map(repr, unknown))}; "
                         f"the options are {', '.join(known)}")


def _hash_code(h, code) -> None:
    """A code object's bytecode and constants into `h`, nested functions by their own code (never by a repr,
    which holds a memory address and would differ between processes)."""
    h.update(code.co_code)
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            _hash_code(h, c)
        elif isinstance(c, frozenset):  # its repr's order follows the string hash seed of the process
            h.update(repr(sorted(map(repr, c))).encode())
        else:
            h.update(repr(c).encode())


def _limits(limits, where: str):
    if limits is None:  # before the import: egglog's (a second or more) is for a compile that saturates
        return None
    from ..rewrites import Limits

    if isinstance(limits, Limits):
        return limits
    if not isinstance(limits, Mapping):
        raise InputError(f"{where}: limits must be a dict of egraft.rewrites.Limits fields, got {limits!r}")
    try:
        return Limits(**limits)
    except TypeError as e:
        raise InputError(f"{where}: limits {dict(limits)!r}: {e}; its keys are "
                         f"{', '.join(f.name for f in fields(Limits))}") from None


def _from_env() -> dict:
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"${ENV_VAR} is not valid JSON ({e}); write e.g. '{{\"budget\": \"30s\"}}'") from None
    if not isinstance(value, dict):
        raise InputError(f"${ENV_VAR} must be a JSON object of egraft options, got {text!r}")
    return value


__all__ = ["Budget", "CompileConfig", "ENV_VAR"]
