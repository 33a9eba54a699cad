"""The `built` fixture: each tiny model family with its step programs, built once per test session."""

from __future__ import annotations

import pytest
import torch
from gen_helpers import FAMILIES, Built

_BUILT: dict = {}


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
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
