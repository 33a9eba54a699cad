"""Shared fixtures for the IR tests: a fresh seed per test, printed so a failure can be replayed.

Set ``EGRAFT_SEED=<n>`` to replay a failing run with the seed it printed.
"""

from __future__ import annotations

import numpy as np
import pytest

from egraft.testing import fresh_seed


class Seeded:
    """A numpy Generator plus the seed it came from (tests put ``self.tag`` in assert messages)."""

    def __init__(self, seed: int):
        self.seed = seed
        self.gen = np.random.default_rng(seed)
        self.tag = f"seed={seed} (replay with EGRAFT_SEED={seed})"


@pytest.fixture
def rng() -> Seeded:
    seed = fresh_seed()
    print(f"egraft test seed={seed}")
    return Seeded(seed)
