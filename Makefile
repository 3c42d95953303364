# The two commands of the quick start:
#   make demo   start a local 8-node GPU cluster, run the example training job, stop the cluster
#   make test   the whole test suite (unit + integration with real server and agent processes)
#   make lint   the static checks make test runs first: ruff and mypy (configured in pyproject.toml)

PYTHON ?= python3
CC ?= cc
VENV := .venv
BIN := $(VENV)/bin
FRONTEND_COMMANDS := sbatch squeue scancel

.PHONY: demo test lint bench clean frontend

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# sbatch, squeue and scancel as one small C program (frontend/shoal-cmd.c) that hands the
# invocation to the server, replacing pip's Python entry points (which it execs for whatever
# it does not handle). Run after every pip install, which writes the entry points again.
# Without a C compiler the Python commands stay: the same behaviour, slower.
INSTALL_FRONTEND = if $(CC) -O2 -Wall -o $(VENV)/shoal-cmd.new frontend/shoal-cmd.c; then \
	  for c in $(FRONTEND_COMMANDS); do cp $(VENV)/shoal-cmd.new $(BIN)/.$$c.new && mv -f $(BIN)/.$$c.new $(BIN)/$$c; done; \
	  rm -f $(VENV)/shoal-cmd.new; \
	else echo "note: no C compiler ($(CC)): sbatch, squeue and scancel stay the Python commands"; fi

# The per-run supervisor of batch jobs as a small C program too (frontend/shoal-stepd.c),
# installed next to the venv's python, where the agent looks for it: a Python supervisor
# costs a job ~70 ms of CPU. Without a C compiler the agent runs the Python one.
INSTALL_STEPD = if $(CC) -O2 -Wall -o $(BIN)/.shoal-stepd.new frontend/shoal-stepd.c; then \
	  mv -f $(BIN)/.shoal-stepd.new $(BIN)/shoal-stepd; \
	else echo "note: no C compiler ($(CC)): batch jobs run under the Python supervisor"; fi

$(VENV)/.installed: pyproject.toml $(wildcard src/shoal/*/*.py) frontend/shoal-cmd.c frontend/shoal-stepd.c | $(BIN)/python
	$(BIN)/pip install -q -e .
	# Byte-compile now: the Slurm commands start in tight loops, and some environments set
	# PYTHONDONTWRITEBYTECODE, which would make every call recompile from source.
	$(BIN)/python -m compileall -q src
	@$(INSTALL_FRONTEND)
	@$(INSTALL_STEPD)
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test]'
	# The two-node DDP acceptance test runs real PyTorch (CPU build, gloo backend).
	$(BIN)/pip install -q torch==2.13.0
	@$(INSTALL_FRONTEND)
	@$(INSTALL_STEPD)
	touch $@

demo: $(VENV)/.installed
	$(BIN)/python examples/demo.py

test: $(VENV)/.installed-test
	$(BIN)/lint-imports
	@$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest -q

# ruff's checks only (never its formatter: the tree is not reformatted), then mypy over src/.
lint: $(VENV)/.installed-test
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

bench: $(VENV)/.installed
	$(BIN)/python bench/bench_foundation.py --short

frontend: | $(BIN)/python
	@$(INSTALL_FRONTEND)
	@$(INSTALL_STEPD)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
