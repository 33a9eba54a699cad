PYTHON ?= python3

.PHONY: install test demo bench-trace

# torch first, only if missing: `pip install torch==2.13.0` finds the CPU
# wheel already on disk on our machines; any other torch spec would pull a
# multi-GB CUDA build. A torch the user already has is kept (pyproject
# requires torch>=2.4).
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install torch==2.13.0
	$(PYTHON) -m pip install -e '.[dev]'

test: install
	$(PYTHON) -m pytest -q -p no:cacheprovider

demo: install
	$(PYTHON) examples/demo.py

bench-trace: install
	$(PYTHON) bench/bench_trace.py
