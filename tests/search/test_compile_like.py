"""``search.pipeline.compile_like``: another size of a compiled program costs a lowering and a check, no search.

The earlier winner's backend and knobs are reused on the new size's graph,
checked by the one check (against the reference when given, else the
float64 interpreter); a knob the backend does not offer there falls back to
a full search, and a wrong program is still a ValidationError.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import egraft
from egraft.errors import ValidationError
from egraft.ir import evaluate
from egraft.search import engine
from egraft.search.config import CompileConfig
from egraft.search.pipeline import compile_like, compile_signature
from egraft.testing import assert_close, fresh_seed, tolerance_for


def _config(**kw):
    return CompileConfig.parse({"fitness": "model", "budget": {"seconds": None, "trials": 3, "population": 2},
                                "limits": {"iterations": 2}, "cache": False, "progress": False, **kw})


def _model():
    torch.manual_seed(fresh_seed())
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8),
                               torch.nn.Softmax(-1)).eval()


class _Searches:
    def __init__(self, monkeypatch):
        self.calls, real = 0, engine.search

        def counted(*a, **k):
            self.calls += 1
            return real(*a, **k)

        monkeypatch.setattr(engine, "search", counted)


def test_a_new_size_reuses_the_winner_without_a_search(monkeypatch):
    model = _model()
    small, big = (egraft.trace(model, (torch.randn(n, 8),)) for n in (4, 12))
    searches = _Searches(monkeypatch)
    prior = compile_signature(small, _config())
    assert searches.calls == 1 and prior.searched
    done = compile_like(prior, big, _config())
    assert searches.calls == 1, "no search for the new size"
    assert not done.searched and "search" not in done.stages and "not searched" in done.result.notes[0]
    assert (done.result.backend, done.result.knobs) == (prior.result.backend, prior.result.knobs)
    assert done.check["sets"] == 1
    rng = np.random.default_rng(fresh_seed())
    for _ in range(2):
        x = rng.standard_normal((12, 8)).astype(np.float32) * 2
        (got,) = done.executable(x)
        (want,) = evaluate(big, [x], np.float64)
        assert_close([np.asarray(got)], [want], tol=tolerance_for(big, 0), what="compile_like at 12 rows")
    # against a reference (the user's model) on given sets, as the Dynamo bucket runner checks it
    sets = [[torch.randn(12, 8)], [torch.randn(12, 8)]]
    checked = compile_like(prior, big, _config(), reference=model, check_sets=sets)
    # (the searched size was checked on the example inputs; another size is checked on the fresh set, the last)
    assert not checked.searched and checked.check["sets"] == 1 and searches.calls == 1
    fresh = sets[-1][0]
    wrong_on_fresh = lambda t: model(t) * (1.01 if t is fresh else 1.0)  # noqa: E731
    with pytest.raises(ValidationError, match="on fresh random inputs"):
        compile_like(prior, big, _config(), reference=wrong_on_fresh, check_sets=sets)


def test_an_unusable_choice_falls_back_to_a_search(monkeypatch):
    model = _model()
    small, big = (egraft.trace(model, (torch.randn(n, 8),)) for n in (3, 7))
    prior = compile_signature(small, _config())
    odd = dataclasses.replace(prior, result=dataclasses.replace(prior.result, knobs={"no_such_knob": 1}))
    searches = _Searches(monkeypatch)
    done = compile_like(odd, big, _config())
    assert done.searched and searches.calls == 1
    assert any("no_such_knob" in note for note in done.result.notes)


def test_a_wrong_program_is_still_refused(monkeypatch):
    model = _model()
    small, big = (egraft.trace(model, (torch.randn(n, 8),)) for n in (3, 7))
    prior = compile_signature(small, _config())
    x = torch.randn(7, 8)
    searches = _Searches(monkeypatch)
    with pytest.raises(ValidationError, match="differs from"):
        compile_like(prior, big, _config(), reference=lambda t: model(t) * 1.01, check_sets=[[x]])
    assert searches.calls == 1, "the failed check fell back to a search, whose winner failed the check too"
