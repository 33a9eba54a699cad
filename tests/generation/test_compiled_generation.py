"""Generation on egraft's COMPILED step programs (egraft.compile(causal_lm, max_batch=, max_length=)).

transformers' eager ``generate`` is the reference throughout: greedy and
seeded sampling, batch 1 and left-padded batches, on GPT-2 and Llama, with
the backend the search picks ("auto") and an explicit torch backend (the
explicit JAX runs are in test_compiled_generation_inplace.py); a saved
artifact run by the light runtime in a fresh process; the compile count
(one search, one program per ladder size, nothing compiled by generate, a
second process served by the search cache); the limits; a session with
several client threads.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from compiled_helpers import (CHUNKS, CONTEXTS, HEAVY, MAX_BATCH, MAX_LENGTH, ROOT, left_padded, reference,
                              run_python)

import egraft
from egraft.errors import InputError
from egraft.runtime.generation import new_state
from egraft.runtime.generation_runtime import GenerationRuntime

CASES = [("gpt2", "auto"), ("llama", "auto"), ("gpt2", "torch")]
IDS = [f"{f}-{b}" for f, b in CASES]
PROMPTS = {"3": [3], "17": [17], "60": [60], "batch3": [3, 17, 60]}
GREEDY = dict(max_new_tokens=64, do_sample=False, eos_token_id=None, pad_token_id=0)
SAMPLED = dict(max_new_tokens=48, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, eos_token_id=None,
               pad_token_id=0)


@pytest.fixture(params=CASES, ids=IDS, scope="module")
def case(request, compiled_of):
    return compiled_of(*request.param)


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_greedy_equals_transformers(case, name):
    model, cm = case
    lengths = PROMPTS[name]
    ids, mask = left_padded(lengths, seed=sum(lengths))
    want = reference(model, ids, mask, **GREEDY)
    got = cm.generate(ids, mask, **GREEDY)
    assert want.shape == (len(lengths), max(lengths) + 64)
    assert torch.equal(got, want)


@pytest.mark.parametrize("seed", [0, 1])
def test_seeded_sampling_equals_transformers(case, seed):
    model, cm = case
    ids, mask = left_padded([5, 17, 40], seed=100 + seed)
    torch.manual_seed(seed)
    want = reference(model, ids, mask, **SAMPLED)
    torch.manual_seed(seed)
    got = cm.generate(ids, mask, **SAMPLED)
    assert torch.equal(got, want)
    one = left_padded([23], seed=200 + seed)[0]  # batch 1 too
    torch.manual_seed(seed)
    want1 = reference(model, one, None, **SAMPLED)
    torch.manual_seed(seed)
    assert torch.equal(cm.generate(one, **SAMPLED), want1)


LOAD_SCRIPT = """
import json, sys
import torch
torch.set_num_threads(1)
import egraft
from egraft.runtime.generation_artifact import GenerationArtifact
out = {}
for name, (directory, cases) in json.loads(sys.argv[1] if len(sys.argv) > 1 else %r).items():
    art = egraft.load(directory)
    assert isinstance(art, GenerationArtifact), type(art)
    out[name] = [art.generate(torch.tensor(ids), torch.tensor(mask), max_new_tokens=64, do_sample=False,
                              eos_token_id=None, pad_token_id=0).tolist() for ids, mask in cases]
out["heavy"] = [m for m in %r if m in sys.modules]
print(json.dumps(out))
"""


def test_saved_artifacts_give_the_same_tokens_in_a_fresh_light_process(compiled_of, tmp_path):
    """cm.save(dir), then egraft.load(dir).generate in a new interpreter: transformers' tokens, and that process
    imports none of transformers, egglog, deap."""
    jobs, want = {}, {}
    for family, backend in CASES[:2]:  # both families (a loaded torch artifact: test_compiled_generation_inplace)
        model, cm = compiled_of(family, backend)
        directory = cm.save(tmp_path / f"{family}-{backend}")
        cases = [left_padded(PROMPTS[n], seed=sum(PROMPTS[n])) for n in sorted(PROMPTS)]
        jobs[f"{family}-{backend}"] = (str(directory), [(i.tolist(), m.tolist()) for i, m in cases])
        want[f"{family}-{backend}"] = [reference(model, i, m, **GREEDY).tolist() for i, m in cases]
    got = run_python(LOAD_SCRIPT % (json.dumps(jobs), HEAVY))
    assert got.pop("heavy") == []
    for name in want:
        assert got[name] == want[name], name


def _runner(program):
    """The runner a step program calls (runtime.step_program's closures)."""
    names = inspect.getclosurevars(program).nonlocals
    return names["runner"] if "runner" in names else names["run"].__self__


def test_a_compiled_and_a_loaded_generation_run_the_same_classes(compiled_of, tmp_path):
    """egraft.compile's generation and egraft.load's run one GenerationRuntime, programs from one adapter calling
    the same runner class, and give the same tokens."""
    for family, backend in CASES:
        model, cm = compiled_of(family, backend)
        art = egraft.load(cm.save(tmp_path / f"{family}-{backend}"))
        compiled, loaded = cm.generation.runtime, art.runtime
        assert type(compiled) is type(loaded) is GenerationRuntime
        assert compiled.programs.programs.keys() == loaded.programs.programs.keys()
        for b, p in compiled.programs.programs.items():
            q = loaded.programs.programs[b]
            assert p.__code__ is q.__code__, (b, p.__qualname__, q.__qualname__)
            assert p.__module__ == "egraft.runtime.step_program"
            assert type(_runner(p)) is type(_runner(q)), b
        ids, mask = left_padded(PROMPTS["batch3"], seed=5)
        assert torch.equal(art.generate(ids, mask, **GREEDY), cm.generate(ids, mask, **GREEDY)), (family, backend)


# --- what was compiled ---------------------------------------------------------------------------------------------

def test_one_search_one_program_per_bucket_and_generate_compiles_nothing(compiled_of, monkeypatch):
    from egraft.runtime.generation import Bucket

    model, cm = compiled_of("gpt2", "auto")
    g = cm.generation
    d = g.describe()
    assert d["chunks"] == list(CHUNKS) and d["contexts"] == list(CONTEXTS) == [32] and d["rows"] == [1]
    full = {Bucket(t, MAX_LENGTH, MAX_BATCH) for t in CHUNKS}  # every chunk size reads max_length slots, all rows
    rows = {Bucket(t, MAX_LENGTH, 1) for t in CHUNKS}  # every chunk size for one row
    contexts = {Bucket(t, 32, r) for t in (1, 4, 16) for r in (1, MAX_BATCH)}  # decode at each; 32 >= 2 T
    assert set(g.programs) == full | rows | contexts == set(g.spec.buckets())
    assert d["programs"] == len(g.programs) == 14 and set(d["compile_s"]) == {b.name for b in g.programs}
    decode = Bucket(1, MAX_LENGTH, MAX_BATCH)
    assert d["searches"] == 1 and g.programs[decode].searched  # the full decode step; the others reused its choices
    assert d["searched"] == [decode.name]
    assert not any(p.searched for b, p in g.programs.items() if b != decode)
    assert not g.programs[decode].result.from_cache  # this run's cache was empty: the search really ran
    # the budget is the whole compile's: the search kept time for the 13 programs after it and counted the exports
    assert any("13 more program(s) of this model" in n for n in g.programs[decode].result.notes)
    assert d["stages_s"]["trace"] >= g.export_s > 0
    mem = d["compile_memory"]  # what set the compile's peak: rises charged to stages this compile has
    assert mem["peak_rss"] >= mem["at_start"] > 0 and set(mem["rise_by_stage"]) <= {
        "trace", "saturate", "reference", "baseline", "search", "final_check", "final_timing", "lower", "validate"}
    assert len(d["backends"]) == 1
    assert d["choices"] == {decode.name: {"backend": g.programs[decode].result.backend,
                                          "knobs": g.programs[decode].result.knobs}}
    programs = dict(g.programs)
    ran, calls = [], dict(g.step_programs.programs)
    for b, p in calls.items():  # which bucket each call runs
        g.step_programs.programs[b] = (lambda b, p: lambda *a: (ran.append(b), p(*a))[1])(b, p)

    def compiled_again(*args, **kwargs):
        raise AssertionError("generate traced, searched or lowered a program")

    import egraft.api.pipeline as api_pipeline
    import egraft.backends as backends
    for mod, name in [(api_pipeline, "trace"), (api_pipeline, "compile_program"), (backends, "lower")]:
        monkeypatch.setattr(mod, name, compiled_again)
    try:
        for n in (1, 5, 17, 33, 60):  # five prompt lengths: plans over every ladder size
            ids = left_padded([n], seed=n)[0]
            assert torch.equal(cm.generate(ids, **GREEDY), reference(model, ids, None, **GREEDY)), n
    finally:
        g.step_programs.programs.update(calls)
    assert g.describe() == d and g.programs == programs
    # one row: the one-row programs throughout, prompt chunks and decode (32 slots while they fit, then all 128);
    # 60 tokens are one chunk of 64 with filler (StepSpec.plan), over all 128 slots
    assert {b for b in ran if b.chunk > 1} == {Bucket(4, 32, 1), Bucket(16, 32, 1), Bucket(64, MAX_LENGTH, 1)}
    assert {b for b in ran if b.chunk == 1} == {Bucket(1, 32, 1), Bucket(1, MAX_LENGTH, 1)}


def test_every_chunk_program_binds_one_copy_of_the_weights(compiled_of):
    """The buckets' programs share the model's weight arrays (one copy in memory, not one per program)."""
    import numpy as np

    model, cm = compiled_of("llama", "auto")
    graphs = {b: p.executable.graph for b, p in cm.generation.programs.items()}
    names = set.intersection(*(set(n for n in g.weights if not n.startswith("__")) for g in graphs.values()))
    params = {n for n, _ in model.named_parameters()}
    assert {n.split(".", 1)[1] for n in names if n.split(".", 1)[-1] in params} == params  # the step's "lm."
    first = graphs[(1, MAX_LENGTH, MAX_BATCH)]
    for b, g in graphs.items():
        assert all(g.weights[n] is first.weights[n] for n in names), b
    held = {id(w): w.nbytes for g in graphs.values() for w in g.weights.values()}
    own = sum(np.asarray(first.weights[n]).nbytes for n in names)
    assert sum(held.values()) < 1.5 * own  # folded values aside, the weights once


SECOND_COMPILE = """
import json, time
import torch
torch.set_num_threads(1)
import egraft
from compiled_helpers import tiny
model = tiny("gpt2")
t, cpu = time.perf_counter(), time.process_time()
cm = egraft.compile(model, device="cpu", backend="auto", budget="1s", max_batch=%d, max_length=%d, chunks=%r,
                    progress=False)
total, cpu = time.perf_counter() - t, time.process_time() - cpu
g = cm.generation
stages = {b.name: p.stages for b, p in g.programs.items()}
decode = max(b for b in g.programs if b.chunk == 1)
print(json.dumps({"total": total, "cpu": cpu, "stages": stages, "decode": decode.name,
                  "from_cache": g.programs[decode].result.from_cache, "describe": g.describe()}))
"""


@pytest.fixture(scope="module")
def second(compiled_of, search_cache):
    """The first compile (in this process, filling this run's cache), then the same compile in a new process."""
    first = compiled_of("gpt2", "auto")[1].generation
    return first, _second_compile(search_cache)


def _second_compile(search_cache) -> dict:
    return run_python(SECOND_COMPILE % (MAX_BATCH, MAX_LENGTH, CHUNKS), env={"EGRAFT_CACHE_DIR": str(search_cache.root)},
                      path=str(ROOT / "tests" / "generation"))


def _tracing(got: dict) -> float:
    """The compile's tracing: the step's exports (made once, before any bucket) and each bucket's lowering of them."""
    return got["describe"]["stages_s"]["trace"]


def _beyond_tracing(got: dict) -> float:
    return got["total"] - _tracing(got)


def test_a_second_process_reads_the_search_cache(second):
    first, got = second
    assert got["from_cache"]
    # max_length 128, no context bucket given: the default ones lie below 128, so none; the full programs and the
    # one-row ones
    assert got["describe"]["contexts"] == [] and got["describe"]["programs"] == 2 * len(CHUNKS) == 8
    assert got["describe"]["searches"] == 1
    assert got["describe"]["backends"] == first.describe()["backends"]
    assert got["stages"][got["decode"]]["saturate"] == 0.0  # no saturation, no search: the cached winner was lowered
    assert first.programs[(1, MAX_LENGTH, MAX_BATCH)].stages["saturate"] > 0.0


LOOP_S = 0.03  # a host whose 10**6-step Python loop takes longer than this has the bound scaled (the test below)


def _host_slowdown() -> float:
    """How much slower than the hosts the 5 s bound was set on this host runs Python: its fastest of three
    10**6-step loops over LOOP_S, at least 1."""
    def loop() -> float:
        t, s = time.perf_counter(), 0
        for i in range(10 ** 6):
            s += i
        return time.perf_counter() - t
    return max(1.0, min(loop() for _ in range(3)) / LOOP_S)


@pytest.mark.timing
def test_a_second_process_compiles_in_under_5_s_beyond_tracing(second, search_cache):
    """The acceptance bound.  Beyond tracing, a cached compile lowers each ladder program (JAX tracing; XLA's
    own disk cache, which egraft.compile turns on with the search cache, skips XLA's compile) and checks it:
    about 2.3 s on a quiet 2-core machine.  A second process timed while another test process shares the
    two cores is timed up to twice more before the bound fails (the machine, not egraft, is then the cause).
    The bound is for hosts that run Python at least as fast as those (a loop of 10**6 steps within LOOP_S); a
    slower host scales it by its own loop's time (a 2-core AVX2-only Zen 1 EPYC: 0.066 s a loop, 5.1 s beyond
    tracing)."""
    first, got = second
    bound = 5.0 * _host_slowdown()
    for _ in range(2):
        if _beyond_tracing(got) < bound:
            break
        got = min(got, _second_compile(search_cache), key=_beyond_tracing)
    trace = _tracing(got)
    beyond = _beyond_tracing(got)
    lower = sum(s.get("lower", 0.0) for s in got["stages"].values())
    print(f"\nsecond process: compile {got['total']:.2f} s, tracing {trace:.2f} s, beyond tracing {beyond:.2f} s "
          f"(of which lowering {lower:.2f} s; first compile {sum(first.compile_s.values()):.2f} s); CPU time of the "
          f"whole compile {got['cpu']:.2f} s; "
          f"stages {got['stages']}")
    assert beyond < bound, (f"a cached compile took {beyond:.2f} s beyond tracing, {lower:.2f} s of it lowering "
                            f"(bound {bound:.1f} s)", got["stages"])


# --- limits --------------------------------------------------------------------------------------------------------

def test_limits_are_refused_clearly_and_nothing_is_lost(compiled_of):
    model, cm = compiled_of("gpt2", "auto")
    g = cm.generation
    ids, mask = left_padded([3, 17, 60], seed=80)
    before = cm.generate(ids, mask, **GREEDY)
    assert torch.equal(before, reference(model, ids, mask, **GREEDY))
    with pytest.raises(InputError, match=rf"60 tokens \+ max_new_tokens=69 is 129 tokens, over the step's "
                                         rf"max_length={MAX_LENGTH}"):
        cm.generate(ids, mask, **{**GREEDY, "max_new_tokens": 69})
    big, big_mask = left_padded([4] * (MAX_BATCH + 1), seed=81)
    with pytest.raises(InputError, match=rf"batch of {MAX_BATCH + 1} rows is over the step's max_batch={MAX_BATCH}"):
        cm.generate(big, big_mask, **GREEDY)
    spec0 = g.spec.state[0]
    saved = g.state[0]
    try:
        g.state[0] = torch.zeros(spec0.shape, dtype=torch.float64)
        with pytest.raises(InputError, match=rf"state '{spec0.name}' is .*float64, but the step was built for "
                                             rf".*{spec0.dtype}"):
            cm.generate(ids, mask, **GREEDY)
        g.state[0] = torch.zeros((spec0.shape[0] + 1, *spec0.shape[1:]), dtype=getattr(torch, spec0.dtype))
        with pytest.raises(InputError, match=rf"state '{spec0.name}' is \[{spec0.shape[0] + 1}, .*but the step "
                                             rf"was built for \[{spec0.shape[0]}, "):
            cm.generate(ids, mask, **GREEDY)
    finally:
        g.state[0] = saved
    assert torch.equal(cm.generate(ids, mask, **GREEDY), before)  # the same caches, the same tokens
    g.state[:] = new_state(g.spec)  # caches made again by hand work too
    assert torch.equal(cm.generate(ids, mask, **GREEDY), before)


def test_a_session_refuses_a_request_over_the_limit_and_keeps_the_others(compiled_of):
    model, cm = compiled_of("gpt2", "auto")
    prompt = left_padded([40], seed=90)[0][0]
    alone = cm.generate(prompt[None], **GREEDY)[0]
    with cm.generation.session() as s:
        running = s.submit(prompt, **GREEDY)
        with pytest.raises(InputError, match=rf"over the step's max_length={MAX_LENGTH}"):
            s.submit(torch.arange(2, 62), max_new_tokens=MAX_LENGTH - 59, do_sample=False)
        assert torch.equal(running.result(timeout=300), alone)


# --- a server on the compiled programs ------------------------------------------------------------------------------

def test_session_threads_each_get_their_tokens_alone(compiled_of):
    """Seven requests (more than max_batch rows) from four threads, greedy and sampled with their own seeds."""
    model, cm = compiled_of("gpt2", "auto")
    reqs = [(3, 20, None), (17, 64, 1), (60, 40, None), (9, 10, 2), (30, 50, 3), (5, 64, None), (45, 30, 4)]
    prompts = [left_padded([n], seed=300 + i)[0][0] for i, (n, _, _) in enumerate(reqs)]

    def options(new, seed):
        if seed is None:
            return dict(max_new_tokens=new, do_sample=False, eos_token_id=None)
        return dict(max_new_tokens=new, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, eos_token_id=None)

    alone = [cm.generate(p[None], generator=None if s is None else torch.Generator().manual_seed(s),
                         **options(new, s))[0] for p, (_, new, s) in zip(prompts, reqs)]
    threads = set()
    with cm.generation.session() as session:
        def client(i):
            threads.add(threading.get_ident())
            _, new, s = reqs[i]
            return session.submit(prompts[i], seed=s, **options(new, s)).result(timeout=300)

        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(client, range(len(reqs))))
        calls = session.calls
    assert len(threads) >= 3
    for i, (g, want) in enumerate(zip(got, alone)):
        assert torch.equal(g, want), reqs[i]
    # the rows were shared: fewer calls than running the requests one after another
    assert calls < sum(len(cm.generation.spec.plan(n)) + new - 1 for n, new, _ in reqs)
