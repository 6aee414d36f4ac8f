# Every target bootstraps .venv itself. torch==2.13.0 is the CPU build on disk here.
# Test targets print their duration; budgets on 2 cores: test-unit < 30 s, test < 8 min
# (the fault matrix < 200 s of it), test-slow < 20 min.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST := TORCH_CPP_LOG_LEVEL=error $(PY) -m pytest -q
TIMED = start=$$(date +%s); $(1); status=$$?; echo "make $@: $$(( $$(date +%s) - start )) s"; exit $$status

.PHONY: venv demo test test-unit test-slow lint typecheck diagrams check bench clean

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

test-slow: $(STAMP)
	@$(call TIMED,$(PYTEST) -m slow)

lint: $(STAMP)
	$(VENV)/bin/ruff check lifecycle tests bench
	$(VENV)/bin/ruff format --check lifecycle tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict lifecycle

diagrams: $(STAMP)
	$(PY) -m lifecycle diagrams
	@if command -v dot >/dev/null; then dot -Tsvg diagrams/lifecycle.dot -o diagrams/lifecycle.svg && echo "wrote diagrams/lifecycle.svg"; \
	else echo "Graphviz 'dot' not found: diagrams/lifecycle.svg not re-rendered"; fi

check: lint typecheck test

bench: $(STAMP)
	TORCH_CPP_LOG_LEVEL=error $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
