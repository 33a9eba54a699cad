"""Fixtures of the plugin tests: a fresh Dynamo per test and a search cache of the module's own."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def _module_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("egraft-cache")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, _module_cache):
    # searches land in a throwaway cache (shared within a module, so a repeated graph is a cache hit),
    # and no compiled graph, guard or recompile counter leaks from one test into the next
    monkeypatch.setenv("EGRAFT_CACHE_DIR", str(_module_cache))
    monkeypatch.delenv("EGRAFT_DYNAMO_OPTIONS", raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
