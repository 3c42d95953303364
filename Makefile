# The two commands of the quick start:
#   make demo   start a local 8-node GPU cluster, run the example training job, stop the cluster
#   make test   the whole test suite (unit + integration with real server and agent processes)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml $(wildcard src/shoal/*/*.py) | $(BIN)/python
	$(BIN)/pip install -q -e .
	# Byte-compile now: the Slurm commands start in tight loops, and some environments set
	# PYTHONDONTWRITEBYTECODE, which would make every call recompile from source.
	$(BIN)/python -m compileall -q src
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test]'
	# The two-node DDP acceptance test runs real PyTorch (CPU build, gloo backend).
	$(BIN)/pip install -q torch==2.13.0
	touch $@

demo: $(VENV)/.installed
	$(BIN)/python examples/demo.py

test: $(VENV)/.installed-test
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

bench: $(VENV)/.installed
	$(BIN)/python bench/bench_foundation.py --short

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
