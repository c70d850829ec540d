# The two entry points of the README: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The tests run on one torch thread unless OMP_NUM_THREADS says otherwise. The demo is left at torch's default (every
# core) or the caller's OMP_NUM_THREADS: at one thread its GRPO steps took 1.5x as long on a 2-core machine (2.85-3.16 s
# against 1.92-1.96 s, docs/demo-seeds.md), past its 10-minute budget.
ONE_THREAD := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1}
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1
# No wheel cache: the two environments hold ~13 GB (CUDA builds of torch) and a cached copy of each download doubled
# what the vLLM one took from a disk that CI shares with the suite's run directories.
export PIP_NO_CACHE_DIR ?= 1

VLLM_VENV ?= .venv-vllm
VLLM_TESTS := tests/rollout/test_vllm_engine.py tests/trainer/test_vllm_train.py tests/evals/test_vllm_eval.py \
  tests/trainer/test_judge_vllm.py tests/rollout/test_vllm_turns.py

.PHONY: demo demo-tools test test-main test-vllm test-dev lint install bench clean

# The demo needs the runtime packages and matplotlib (curves.png) only; the tests add the dev tools (pytest, TRL for
# the parity tests, DeepSpeed, import-linter). A dev install holds everything the demo needs, so it marks both.
$(VENV)/.installed-demo: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[plot]'
	touch $@

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed-demo

install: $(VENV)/.installed

demo: $(VENV)/.installed-demo
	$(VENV)/bin/vlgrpo demo --out runs/demo

# Thinking with images on the CPU: the zoom task with the zoom-in tool and without it (docs/thinking-with-images.md).
demo-tools: $(VENV)/.installed-demo
	$(VENV)/bin/vlgrpo demo --tools --out runs/demo-tools

# The main suite, then the vLLM tests in vLLM's own environment (its CPU build: see scripts/vllm_env.sh). That
# environment (~3 GB of downloads) is built in the background, at the lowest CPU priority, while the main suite runs:
# its log is $(VLLM_VENV).log, printed if the build fails.
test: $(VENV)/.installed
	@nice -n 19 $(MAKE) --no-print-directory $(VLLM_VENV)/.installed > $(VLLM_VENV).log 2>&1 & build=$$!; \
	$(MAKE) --no-print-directory test-main; main=$$?; \
	wait $$build; built=$$?; \
	if [ $$built != 0 ]; then cat $(VLLM_VENV).log; echo "make test: building $(VLLM_VENV) failed"; exit $$built; fi; \
	if [ $$main != 0 ]; then exit $$main; fi; \
	$(MAKE) --no-print-directory test-vllm

# lint first: lint-imports checks the layers and import rules of pyproject.toml's [tool.importlinter]; ruff the lint
# rules and the format of [tool.ruff] (`ruff format` and `ruff check --fix` repair most of what it reports).
LINT_PATHS := vlgrpo tests benchmarks dev scripts
lint: $(VENV)/.installed
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

test-main: lint
	$(ONE_THREAD) $(PY) -m pytest -q -m "not gpu and not vllm"

$(VLLM_VENV)/.installed: pyproject.toml scripts/vllm_env.sh
	bash scripts/vllm_env.sh $(VLLM_VENV)

test-vllm: $(VLLM_VENV)/.installed
	$(ONE_THREAD) VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm -p no:cacheprovider $(VLLM_TESTS)

# Research code (dev/: the tiny base's builder, probes, tuning, the seed-table tooling) has tests of its own, kept out of
# `make test`: they pin experiments, not the product.
test-dev: $(VENV)/.installed
	$(ONE_THREAD) $(PY) -m pytest -q -p no:cacheprovider dev/tests

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM_VENV).log runs .pytest_cache
