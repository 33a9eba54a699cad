"""egraft's EGRAFT_* on/off switches are read one way: unset or empty is the default, the usual words turn them on
or off, anything else is an error naming the variable."""

from __future__ import annotations

import pytest

from egraft.env import flag
from egraft.errors import InputError

NAME = "EGRAFT_TEST_SWITCH"


@pytest.mark.parametrize("default", [True, False])
def test_unset_or_empty_is_the_default(monkeypatch, default):
    monkeypatch.delenv(NAME, raising=False)
    assert flag(NAME, default) is default
    monkeypatch.setenv(NAME, "  ")
    assert flag(NAME, default) is default


@pytest.mark.parametrize("value,want", [("1", True), ("true", True), ("Yes", True), (" ON ", True),
                                        ("0", False), ("false", False), ("NO", False), ("off", False)])
def test_the_usual_words_turn_it_on_or_off_whatever_the_default(monkeypatch, value, want):
    monkeypatch.setenv(NAME, value)
    assert flag(NAME, True) is want and flag(NAME, False) is want


def test_any_other_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(NAME, "maybe")
    with pytest.raises(InputError, match=r"EGRAFT_TEST_SWITCH='maybe' is not an on/off switch: set it to 1 .* or 0"):
        flag(NAME, False)


def test_the_switches_egraft_reads_follow_it(monkeypatch):
    """A switch documented as `=0` (off), one documented as `=1` (on), and a value that is neither."""
    from egraft.runtime import gc_pause, hashed, xla_cache

    monkeypatch.setenv("EGRAFT_XLA_CACHE", "off")
    assert not xla_cache.caching()
    monkeypatch.setenv("EGRAFT_XLA_CACHE", "")
    assert xla_cache.caching()
    monkeypatch.setenv(hashed.ENV_VAR, "yes")
    assert hashed._rehash()
    monkeypatch.setenv(gc_pause.ENV_VAR, "bogus")
    with pytest.raises(InputError, match=gc_pause.ENV_VAR):
        with gc_pause.paused():
            pass
