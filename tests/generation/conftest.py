"""The `built` fixture: each tiny model family with its step programs, built once per test session."""

from __future__ import annotations

import pytest
from gen_helpers import FAMILIES, Built

_BUILT: dict = {}


@pytest.fixture(params=sorted(FAMILIES), scope="session")
def built(request) -> Built:
    if request.param not in _BUILT:
        _BUILT[request.param] = Built(request.param)
    return _BUILT[request.param]
