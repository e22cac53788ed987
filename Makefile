# One command sets up and runs the main job (`make run`), one sets up and runs the tests (`make test`).
# Set-up is idempotent: the venv is rebuilt only when pyproject.toml or the constraints change.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
CONSTRAINTS := constraints-cpu.txt
STAMP := $(VENV)/.installed
# pytest-xdist workers, one per core; each test module stays on one worker (its module fixtures,
# a trained run or a Slurm cluster, are built once), modules in collection order (the longest
# first: tests/conftest.py). Much of a test's time is single-threaded (imports, tiny steps,
# Slurm's scheduler), so a second worker uses the second core.
PYTEST_WORKERS ?= auto

.PHONY: setup run plan lint test clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	@# torch first, from the CPU build; everything after it under the constraint that keeps it.
	$(PIP) install -q -c $(CONSTRAINTS) torch==2.13.0
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[dev]'
	touch $(STAMP)

run: setup
	$(PY) -m tinytrain $(ARGS)

plan: setup
	$(PY) -m tinytrain mode=plan $(ARGS)

lint: setup
	$(PY) -m ruff check .

test: setup
	@bash .ci/install-slurm
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) runs outputs multirun .pytest_cache
