PYTHON ?= python3

.PHONY: install test demo bench-trace bench-saturation bench-cpu bench-search bench-calls bench-generate coverage fuzz-long fuzz-10k

# torch first, only if missing: `pip install torch==2.13.0` finds the CPU
# wheel already on disk on our machines; any other torch spec would pull a
# multi-GB CUDA build. A torch the user already has is kept (pyproject
# requires torch>=2.4).
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install torch==2.13.0
	$(PYTHON) -m pip install -e '.[dev]'

# the CI suite (tests marked slow or gpu are deselected in pyproject.toml)
test: install
	$(PYTHON) -m pytest -q -p no:cacheprovider -n 2

# compile a GPT-2 block for this CPU (20 s search), report the speed-up over eager and torch.compile,
# save the artifact and run it in a fresh process through egraft.load
demo: install
	$(PYTHON) examples/demo.py

# --- by hand: benchmarks, coverage, long fuzzers ---------------------------------
bench-trace: install
	$(PYTHON) bench/trace_time.py

bench-saturation: install
	$(PYTHON) bench/saturation.py --reps 3

bench-cpu: install
	$(PYTHON) bench/cpu_backends.py --threads 1

# the search vs direct / greedy / torch eager / torch.compile, one pinned core (THREADS=2 for both cores)
THREADS ?= 1
bench-search: install
	$(PYTHON) bench/search.py --threads $(THREADS) --budget 40 --gpt2-compile --out bench/results/search-$(THREADS)thread.json

# per-call overhead of an executable (and of CompiledModel and a loaded artifact) against bare jax.jit and torch eager
bench-calls: install
	taskset -c 0 $(PYTHON) bench/call_overhead.py --repeats 100 --calls 200 --core 0

# greedy generation (64 tokens, prompts 16/128/512, batch 1/4, one pinned core and both): HF eager, HF static
# cache + Inductor, vLLM (its own venv: $$EGRAFT_VLLM_VENV, else /work/vllmenv or .venv-vllm), egraft through
# torch.compile and through egraft.compile(...).generate; 1-2 hours on 2 cores. `bench/generate.py --quick`: minutes
bench-generate: install
	$(PYTHON) bench/generate.py

coverage: install
	$(PYTHON) scripts/opinfo_coverage.py

# the long equivalence fuzzer: random programs saturated and every extraction checked in float64,
# in chunks of 100 spread over 2 workers; it ends with "fuzz: N programs, M variants checked".
# A failure prints the replay command (EGRAFT_SEED=<n> pytest '<test id>').
# fuzz-long: 3,000 programs; fuzz-10k: 10,000; any count: EGRAFT_FUZZ_PROGRAMS=<n> make fuzz-long
fuzz-long: install
	$(PYTHON) -m pytest -q -p no:cacheprovider -n 2 -m slow tests/rewrites/test_fuzz.py -k random_programs_long

fuzz-10k: install
	EGRAFT_FUZZ_PROGRAMS=10000 $(PYTHON) -m pytest -q -p no:cacheprovider -n 2 -m slow tests/rewrites/test_fuzz.py -k random_programs_long
