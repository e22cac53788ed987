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

.PHONY: setup run plan lint test test-compat clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	@# torch first, from the CPU build; everything after it under the constraint that keeps it.
	$(PIP) install -q --no-compile -c $(CONSTRAINTS) torch==2.13.0
	$(PIP) install -q --no-compile -c $(CONSTRAINTS) -e '.[dev]'
	@# Bytecode for every installed module on every core (pip compiles one file at a time: ~55 s of
	@# a fresh set-up here); files that do not compile (templates, examples) are skipped, as pip does.
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
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

# The unit tests, then the CLI runs below, against the GPU image's transformers (5.17). Only
# transformers is swapped, with the huggingface-hub it accepts (< 2): installed alone into .compat/
# and put first on the path of pytest and of every process it starts; the rest is the dev venv's.
# The CLI runs are where the two versions differ (5.17 checkpoints around a layer's call, 5.23
# inside its forward): the throughput levers under every strategy, compiled blocks at tp 2 and
# under ZeRO-3, Ulysses. ~5 min on 2 cores: not part of `test`.
COMPAT_TRANSFORMERS ?= 5.17.0
COMPAT_HUB ?= huggingface-hub>=1.5,<2
COMPAT_DIR := .compat/transformers-$(COMPAT_TRANSFORMERS)
COMPAT_RUNS := tests/integration/test_resume.py::test_a_signal_saves_exits_75_and_the_resumed_run_equals_an_uninterrupted_one \
	tests/integration/test_tensor_parallel.py::test_compiled_blocks_train_at_tp2_in_every_checkpointing_mode \
	tests/integration/test_deepspeed.py::test_compiled_layers_under_zero3_compile_once_and_train_as_eager \
	tests/integration/test_train_cpu.py::test_compiled_blocks_compile_once_whatever_the_depth \
	tests/integration/test_context_parallel.py::test_ulysses_over_two_ranks_equals_one_rank

test-compat: setup
	@test -d $(COMPAT_DIR) || $(PIP) install -q --no-deps --target $(COMPAT_DIR) transformers==$(COMPAT_TRANSFORMERS) '$(COMPAT_HUB)'
	PYTHONPATH=$(CURDIR)/$(COMPAT_DIR):$(CURDIR) $(PY) -c "import transformers; assert transformers.__version__ == '$(COMPAT_TRANSFORMERS)', transformers.__file__; print('transformers', transformers.__version__)"
	PYTHONPATH=$(CURDIR)/$(COMPAT_DIR):$(CURDIR) $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder tests/unit $(PYTEST_ARGS)
	PYTHONPATH=$(CURDIR)/$(COMPAT_DIR):$(CURDIR) $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder $(COMPAT_RUNS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs outputs multirun .pytest_cache .compat
