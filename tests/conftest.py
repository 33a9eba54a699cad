"""Suite-wide setup: Triton's interpreter, one replayable seed per test, no silent skips.

Triton reads TRITON_INTERPRET when it is first imported, so it is set here,
before any test module imports triton: without a GPU, Triton kernels run
under the interpreter.  On a GPU machine, `EGRAFT_TEST_DEVICE=cuda` keeps
real GPU execution (bench/gpu_check.py sets it).

**Seeds.** Every test runs under one seed drawn by
``egraft.testing.fresh_seed()``: it is put in ``EGRAFT_SEED`` for the test's
duration (so every ``fresh_seed()`` call inside the test returns it) and
seeds the global ``random``, ``numpy.random`` and ``torch`` generators and
Hypothesis's seed.  A failing test's report carries an "egraft seed" section
with the command that replays it: ``EGRAFT_SEED=<n> pytest '<test id>'``.
Hypothesis also has its own replay: the failure prints the falsifying
example, failures are replayed first from its example database
(``.hypothesis/``), and ``pytest --hypothesis-seed=<n>`` (which then wins
over ``EGRAFT_SEED``) or ``@hypothesis.seed(n)`` fixes its seed.

**Skips.** Required dependencies are imported plainly, so a missing one is an
error, not a skip.  A skip is allowed only on a test marked ``host_specific``
(it runs on one kind of host, CPU-interpreted or CUDA, and its ``skipif`` on
the other kind is expected).  Any other skip -- a test
skip, a module-level skip at collection -- is listed at the end of the run
and fails it (exit status 1).  ``EGRAFT_ALLOW_SKIPS=1`` lists them without
failing, for local runs only.

**Fuzz summary.** Tests that record the ``fuzz_programs`` / ``fuzz_variants``
properties (tests/rewrites/test_fuzz.py) are summed into one line at the end:
``fuzz: N programs, M variants checked``.
"""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import pytest

if os.environ.get("EGRAFT_TEST_DEVICE", "cpu") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from egraft.testing import fresh_seed  # noqa: E402  (after TRITON_INTERPRET is set)

def pytest_configure(config):  # the markers (slow, gpu, host_specific) are registered in pyproject.toml
    config._egraft_skips = []  # (test id, reason) of every skip not declared host_specific
    config._egraft_fuzz = [0, 0]  # programs, variants
    _CONFIG[0] = config


# --- one seed per test ----------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _egraft_seed(request, monkeypatch):
    seed = fresh_seed()  # EGRAFT_SEED when set
    monkeypatch.setenv("EGRAFT_SEED", str(seed))
    random.seed(seed)
    np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
    request.node._egraft_seed = seed
    # Hypothesis: the same seed, unless --hypothesis-seed was given (hypothesis's pytest plugin sets
    # this same module attribute for --hypothesis-seed)
    hcore = sys.modules.get("hypothesis.core") if request.config.getoption("hypothesis_seed", None) is None else None
    if hcore is not None and hasattr(hcore, "global_force_seed"):
        monkeypatch.setattr(hcore, "global_force_seed", seed)
    yield seed


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    seed = getattr(item, "_egraft_seed", None)
    if report.failed and seed is not None:
        report.sections.append(("egraft seed", f"seed {seed}; replay: EGRAFT_SEED={seed} pytest '{item.nodeid}'"))
    return report


# --- the long tests first ---------------------------------------------------------------------------

# The directories and files whose tests compile whole generations (tens of seconds each).  xdist hands the
# tests out in collection order, so a long test collected last leaves the other worker idle while it runs;
# these go first, each file's tests still together and in their own order, and the short tests fill the end.
LONG_FIRST = ("tests/generation/", "tests/bench/", "tests/test_examples.py", "tests/plugins/test_dynamo_static_cache.py")


@pytest.hookimpl(trylast=True)  # after pytest's own ordering (by fixture scope), which this sort keeps
def pytest_collection_modifyitems(session, config, items):
    root = str(config.rootpath)

    def long(item) -> bool:
        rel = os.path.relpath(str(item.path), root).replace(os.sep, "/")
        return rel.startswith(LONG_FIRST)

    items[:] = sorted(items, key=lambda item: not long(item))  # (a stable sort: the order within each part kept)


# --- the skip guard and the fuzz summary (on the controller under xdist) ---------------------------

_CONFIG: list = [None]  # the session's config (report hooks are not given it)


def _controller(config) -> bool:
    return not hasattr(config, "workerinput")


def _reason(report) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        return str(lr[2]).removeprefix("Skipped: ")
    return str(lr)


def pytest_runtest_logreport(report):
    config = _CONFIG[0]
    if config is None or not _controller(config):
        return
    if report.skipped and not hasattr(report, "wasxfail") and "host_specific" not in report.keywords:
        config._egraft_skips.append((report.nodeid, _reason(report)))
    if report.when == "call":
        props = dict(report.user_properties)
        config._egraft_fuzz[0] += int(props.get("fuzz_programs", 0))
        config._egraft_fuzz[1] += int(props.get("fuzz_variants", 0))


def pytest_collectreport(report):
    config = _CONFIG[0]
    if config is not None and _controller(config) and report.skipped:
        config._egraft_skips.append((report.nodeid or "<collection>", _reason(report)))


def _skips_fail(config) -> bool:
    return bool(config._egraft_skips) and os.environ.get("EGRAFT_ALLOW_SKIPS") != "1"


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    if _controller(session.config) and _skips_fail(session.config) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _controller(config):
        return
    programs, variants = config._egraft_fuzz
    if programs:
        terminalreporter.write_line(f"fuzz: {programs} programs, {variants} variants checked")
    skips = config._egraft_skips
    if skips:
        verdict = "allowed by EGRAFT_ALLOW_SKIPS=1" if not _skips_fail(config) else "this fails the run"
        terminalreporter.write_sep("=", f"{len(skips)} unexplained skip(s): {verdict}", red=True, bold=True)
        for nodeid, reason in skips:
            terminalreporter.write_line(f"SKIPPED {nodeid}: {reason}")
        terminalreporter.write_line(
            "A required dependency must be importable (a missing one is an error, not a skip); a test that "
            "runs on one kind of host only is marked @pytest.mark.host_specific.")
