# Every target bootstraps .venv itself. torch==2.13.0 is the CPU build on disk here.
# Test targets print their duration; budgets on 2 cores: test-unit < 30 s, test < 8 min
# (the fault matrix < 200 s of it), test-slow < 20 min.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST := TORCH_CPP_LOG_LEVEL=error $(PY) -m pytest -q
TIMED = start=$$(date +%s); $(1); status=$$?; echo "make $@: $$(( $$(date +%s) - start )) s"; exit $$status

.PHONY: venv demo test test-unit test-slow lint typecheck diagrams check bench clean mermaid gpu-wheelhouse gpu-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,inprocess]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m lifecycle demo

# The README's test command: everything but the slow suites.
test: $(STAMP)
	@$(call TIMED,$(PYTEST) -m "not slow")

# Torch-free tests only; the run fails if anything imported torch.
test-unit: $(STAMP)
	@$(call TIMED,LIFECYCLE_TORCH_FREE=1 $(PYTEST) -m "not slow" tests/core tests/test_layout.py tests/reliability/test_expected.py)

test-slow: $(STAMP) mermaid
	@$(call TIMED,$(PYTEST) -m slow)

# The pinned mermaid npm package (tools/mermaid/package-lock.json) that test-slow parses show's diagrams with.
# Without node it installs nothing: the parse test then skips (fails under CI=true).
MERMAID := tools/mermaid/node_modules/.installed

mermaid: $(MERMAID)

$(MERMAID): tools/mermaid/package.json tools/mermaid/package-lock.json
	@if command -v node >/dev/null; then npm ci --prefix tools/mermaid --no-audit --no-fund && touch $@; \
	else echo "node not found: tools/mermaid not installed, the Mermaid parse test will skip"; fi

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

# The GPU check (README, "On GPUs"). gpu-wheelhouse, where the package index is reachable: the cp312
# manylinux x86_64 wheels of tools/gpu-wheelhouse.txt (every runtime dependency but torch) in
# build/gpu-wheelhouse, checked complete and under 60 MiB. gpu-check, on the GPU host (its own python3
# and CUDA torch, no index; copy the checkout with build/gpu-wheelhouse): tests/gpu, one rank per GPU,
# and a summary table (also in build/gpu-check/summary.md).
gpu-wheelhouse: $(STAMP)
	$(PY) tools/gpu_check.py wheelhouse

gpu-check:
	python3 tools/gpu_check.py run

bench: $(STAMP)
	TORCH_CPP_LOG_LEVEL=error $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
