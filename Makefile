# Every target bootstraps .venv itself. torch==2.13.0 is the CPU build on disk here.
# Test targets print their duration; budgets on 2 cores: test-unit < 30 s, test < 8 min
# (the fault matrix < 200 s of it), test-slow < 25 min.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST := TORCH_CPP_LOG_LEVEL=error $(PY) -m pytest -q
SLOW_SAMPLE ?= 0.2
TIMED = start=$$(date +%s); $(1); status=$$?; echo "make $@: $$(( $$(date +%s) - start )) s"; exit $$status

.PHONY: venv venv-compat demo test test-loaded test-unit test-slow test-slow-all test-compat fuzz-all lint typecheck diagrams check bench clean mermaid chromium show-png gpu-wheelhouse gpu-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,inprocess]' megatron-core==0.16.1 nvidia-resiliency-ext==0.4.1
	touch $(STAMP)

# The newest stack this machine installs (docs/reference.md, "Supported versions"), in its own folder:
# Python 3.12 (here a pyenv shim that runs only with PYENV_VERSION set), torch 2.15.0 (the CUDA
# build, which runs on the CPU: about 3 GB of downloads), megatron-core 0.19.2, and NVRx 0.7.0.
# The machines' pip configuration caps torch at 2.14.1: PIP_CONSTRAINT=/dev/null lifts it for the one
# pip install below (a second install under the cap would swap torch back). NVRx >= 0.5 ships only
# manylinux_2_39 wheels; tools/compat_wheel.py re-tags 0.7.0's as linux_x86_64 for this test env.
COMPAT_PYTHON ?= env PYENV_VERSION=3.12.1 python3.12
COMPAT_VENV := .venv-compat
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_WHEELS := build/compat-wheels
COMPAT_STACK := torch==2.15.0 megatron-core==0.19.2
COMPAT_NVRX := nvidia-resiliency-ext==0.7.0
# The stamp names the pins, so changing one rebuilds the environment; nothing else does.
empty :=
space := $(empty) $(empty)
COMPAT_STAMP := $(COMPAT_VENV)/.installed-$(subst $(space),+,$(subst ==,-,$(COMPAT_STACK) $(COMPAT_NVRX)))

venv-compat: $(COMPAT_STAMP)

$(COMPAT_STAMP): pyproject.toml tools/compat_wheel.py
	rm -rf $(COMPAT_VENV) $(COMPAT_WHEELS)
	$(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install --quiet --upgrade pip
	$(COMPAT_PY) tools/compat_wheel.py $(COMPAT_NVRX) $(COMPAT_WHEELS)
	PIP_CONSTRAINT=/dev/null $(COMPAT_PY) -m pip install --quiet $(COMPAT_STACK) -e '.[dev]' $(COMPAT_WHEELS)/*.whl
	touch $(COMPAT_STAMP)

demo: $(STAMP)
	$(PY) -m lifecycle demo

# The second stack (venv-compat, installed first and counted in the time; budget < 15 min here):
# the demo at TP=2 with a failure on rank 1 and a retry, then the suites that touch Megatron-core,
# NVRx and nccl settings. A second run reuses the environment (stamp), so it only tests.
COMPAT_TESTS := tests/distributed/test_megatron_clean.py tests/distributed/test_nccl_settings.py \
	tests/restart tests/training tests/checkpoint
COMPAT_DEMO := --steps 40 --tp 2 --fail-at step --fail-rank 1 --retry
COMPAT_LOG := build/test-compat-demo.log

test-compat:
	@$(call TIMED,$(MAKE) --no-print-directory venv-compat && mkdir -p build && echo "demo $(COMPAT_DEMO)" \
	&& { $(COMPAT_PY) -m lifecycle demo $(COMPAT_DEMO) >$(COMPAT_LOG) 2>&1 || { tail -n 40 $(COMPAT_LOG); false; }; } \
	&& grep '^demo: succeeded' $(COMPAT_LOG) \
	&& TORCH_CPP_LOG_LEVEL=error $(COMPAT_PY) -m pytest -q $(COMPAT_TESTS))

# The README's test command: everything but the slow suites.
test: $(STAMP)
	@$(call TIMED,$(PYTEST) -m "not slow")

# make test on a busy machine: one busy loop pinned to each core this process may use (taskset), killed
# however the run ends (each loop also ends by itself once the shell that started it is gone). Load is a
# test condition: a test that fails here waits on a guessed time, not on an event. Not in CI; the budgets
# above are for a quiet machine (a loaded run took about three times as long: docs/reference.md).
test-loaded: $(STAMP)
	@pids=""; trap 'kill $$pids 2>/dev/null; wait $$pids 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	for core in $$($(PY) -c 'import os; print(*sorted(os.sched_getaffinity(0)))'); do \
	  taskset -c $$core sh -c 'while kill -0 $$PPID 2>/dev/null; do :; done' & pids="$$pids $$!"; \
	done; echo "make $@: a busy loop on each of cores $$($(PY) -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"; \
	$(MAKE) --no-print-directory test

# Torch-free tests only; the run fails if anything imported torch.
test-unit: $(STAMP)
	@$(call TIMED,LIFECYCLE_TORCH_FREE=1 $(PYTEST) -m "not slow" tests/core tests/journal tests/test_layout.py tests/test_measurements.py tests/test_private_imports.py tests/reliability/test_expected.py)

# The fuzzers over their whole space (make test runs a seeded sample of each): the interrupt and
# asynchronous-exception fuzzers (about 6 minutes) and the checkpoint abort fuzz's 500 cases (about 2). Not in CI.
fuzz-all: $(STAMP)
	@$(call TIMED,LIFECYCLE_FUZZ_SAMPLE=0 LIFECYCLE_ASYNC_FUZZ_SAMPLE=0 LIFECYCLE_CKPT_FUZZ_SAMPLE=0 $(PYTEST) -m "not slow" \
	tests/reliability/test_interrupt_fuzzer.py tests/reliability/test_async_fuzzer.py tests/checkpoint/test_abort_fuzz.py)

# Prints its ten slowest tests (setup, call and teardown apart) and its total: the ledger of docs/reference.md.
test-slow: $(STAMP) mermaid chromium
	@$(call TIMED,LIFECYCLE_SLOW_SAMPLE=$(SLOW_SAMPLE) $(PYTEST) -m slow --durations=10)

# Every slow test, each sampled family whole (test-slow runs a seeded share of each: tests/conftest.py), and 30
# SIGKILLs mid-save instead of 12 (tests/checkpoint/test_abort_fuzz.py). Not in CI.
test-slow-all: $(STAMP) mermaid chromium
	@$(call TIMED,LIFECYCLE_CKPT_KILLS=30 $(PYTEST) -m slow --durations=10)

# The pinned mermaid npm package (tools/mermaid/package-lock.json) that test-slow parses show's diagrams with.
# Without node it installs nothing: the parse test then skips (fails under CI=true).
MERMAID := tools/mermaid/node_modules/.installed

mermaid: $(MERMAID)

$(MERMAID): tools/mermaid/package.json tools/mermaid/package-lock.json
	@if command -v node >/dev/null; then npm ci --prefix tools/mermaid --no-audit --no-fund && touch $@; \
	else echo "node not found: tools/mermaid not installed, the Mermaid parse test will skip"; fi

# Headless Chromium (Debian's package, no browser download) that test-slow opens show's page in. Installed with
# apt-get as root (or through sudo without a password); elsewhere it must be there already: the browser test then
# skips (fails under CI=true).
chromium:
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	elif command -v apt-get >/dev/null && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then \
	  sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	else echo "chromium not found and not installable here (apt-get as root): the browser test will skip"; fi

# docs/show.png, the README's picture of show --html on the demo's failing run (4 ranks, rank 2 killed), 1400 x 1100.
show-png: $(STAMP) chromium
	$(PY) tools/show_png.py docs/show.png

lint: $(STAMP)
	$(VENV)/bin/ruff check lifecycle tests bench tools
	$(VENV)/bin/ruff format --check lifecycle tests bench tools

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict lifecycle

diagrams: $(STAMP)
	$(PY) -m lifecycle diagrams
	@if command -v dot >/dev/null; then dot -Tsvg diagrams/lifecycle.dot -o diagrams/lifecycle.svg && echo "wrote diagrams/lifecycle.svg"; \
	else echo "Graphviz 'dot' not found: diagrams/lifecycle.svg not re-rendered"; fi

check: lint typecheck test

# The GPU check (docs/howto.md, "On GPUs"), on two stacks of libraries, both on the GPU host's own torch:
# ci (megatron-core 0.16.1, NVRx 0.4.1) and newest (megatron-core 0.19.2, NVRx 0.7.0). gpu-wheelhouse,
# where the package index is reachable: the cp312 manylinux x86_64 wheels of tools/gpu-wheelhouse.txt
# and tools/gpu-wheelhouse-newest.txt (every runtime dependency but torch) in build/gpu-wheelhouse and
# build/gpu-wheelhouse-newest, each checked complete and under 60 MiB. gpu-check, on the GPU host (its
# own python3 and CUDA torch, no index; copy the checkout with build/): tests/gpu on each stack, one rank
# per GPU, and a summary table each (build/gpu-check/summary.md, build/gpu-check-newest/summary.md).
# NVRx 0.7.0 is manylinux_2_39 only: on an older glibc the newest stack is refused (exit 2) and said so.
gpu-wheelhouse: $(STAMP)
	$(PY) tools/gpu_check.py wheelhouse --stack ci
	$(PY) tools/gpu_check.py wheelhouse --stack newest

gpu-check:
	python3 tools/gpu_check.py run --stack ci; ci=$$?; python3 tools/gpu_check.py run --stack newest; \
	newest=$$?; echo "gpu-check: ci stack exit $$ci, newest stack exit $$newest"; [ $$ci -eq 0 ] && [ $$newest -eq 0 ]

bench: $(STAMP)
	TORCH_CPP_LOG_LEVEL=error $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) $(COMPAT_VENV) build *.egg-info
