# Every target bootstraps .venv itself. torch==2.13.0 is the CPU build on disk here.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-fast lint typecheck diagrams check bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,inprocess]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m lifecycle demo

test: $(STAMP)
	TORCH_CPP_LOG_LEVEL=error $(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check lifecycle tests $(wildcard bench)
	$(VENV)/bin/ruff format --check lifecycle tests $(wildcard bench)

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
