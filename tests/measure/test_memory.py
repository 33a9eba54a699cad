"""measure.memory: the peak's rises are charged to the stage that ended after them."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from egraft.measure import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")
def test_a_stage_that_raises_the_peak_is_charged_with_the_rise():
    if not memory.reset_peak():  # the peak back to the present RSS: an earlier test's would hide the allocation
        pytest.skip("this kernel does not reset the peak RSS")
    with memory.ledger() as led:
        memory.mark("before")  # whatever the process did so far is not the stages'
        small = np.ones(1 << 10)
        memory.mark("small")
        big = np.ones(48 << 20)  # 384 MB, every page written
        big[::512] += 1
        memory.mark("big")
        del big
        memory.mark("after")  # freed: the peak does not fall, and nothing is charged
    report = led.report()
    assert report["rise_by_stage"].get("big", 0) > 300e6, report
    assert report["rise_by_stage"].get("small", 0) < 50e6 and "after" not in report["rise_by_stage"], report
    assert report["peak_rss"] >= report["at_start"] + report["rise_by_stage"]["big"]
    assert list(report["rise_by_stage"])[0] == "big"  # largest first
    del small
    memory.mark("outside")  # no ledger open: nothing to charge, no error
    assert "outside" not in led.rises
