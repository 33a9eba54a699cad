"""The `built` fixture: each tiny model family with its step programs, built once per test session."""

from __future__ import annotations

import pytest
import torch
from gen_helpers import FAMILIES, Built

_BUILT: dict = {}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # per module: tests/generation is no package, and a wider scope outlived it
    """Tiny models run on one thread: on a shared CPU, torch's thread pool makes each step 10-50x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=sorted(FAMILIES), scope="session")
def built(request) -> Built:
    if request.param not in _BUILT:
        _BUILT[request.param] = Built(request.param)
    return _BUILT[request.param]


# --- compiled generation (tests/generation/test_compiled_*.py) ---------------------------------------------------
# package scope, not session: the package's one-thread fixture is set up before them, so they compile on one thread

@pytest.fixture(scope="package")
def search_cache(tmp_path_factory):
    """One search cache for this run's compiles, in a temporary directory (never the user's)."""
    from egraft.search.cache import Cache

    return Cache(tmp_path_factory.mktemp("egraft-search-cache"))


_COMPILED: dict = {}


@pytest.fixture(scope="package")
def compiled_of(search_cache):
    """compiled_of(family, backend) -> (model, CompiledModel): each compiled once per run, on the ladder CHUNKS."""
    from compiled_helpers import compile_tiny

    def get(family: str, backend: str):
        if (family, backend) not in _COMPILED:
            _COMPILED[family, backend] = compile_tiny(family, backend, search_cache)
        return _COMPILED[family, backend]

    return get
