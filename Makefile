# Every target installs what it needs into .venv: pyproject.toml's ranges, pinned
# exactly by constraints/dev.txt (a change to either reinstalls).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CONSTRAINTS := constraints/dev.txt
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(CONSTRAINTS) | cksum | cut -d' ' -f1)
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install lint format test test-slow notebooks conformance clients demo bench clean compat-range compat-pair

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e ".[tensorflow,dev,demo,notebooks,clients]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(PY) -m ruff check keras_replicator tests benchmarks examples simulated_cluster
	$(PY) -m ruff format --check keras_replicator tests benchmarks examples simulated_cluster
	$(PY) -m mypy  # the public API: mypy.ini

# The default run in two processes (pytest-xdist), whole files to each, so a
# file's module fixtures are built once: 10:47 of tests instead of about 14:30 on
# this 2-core machine. TEST_PROCESSES=1 runs it in one process.
TEST_PROCESSES ?= 2

test: lint
	$(PY) -m pytest -q --durations=25 $(if $(filter 1,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES) --dist loadfile)

test-slow: install
	$(PY) -m pytest -q -m slow

notebooks: install
	$(PY) -m pytest -q -m notebook

conformance: install
	$(VENV)/bin/keras-replicator test --isolate-stock

clients: install
	$(PY) -m tests.clients.table

demo: install
	$(VENV)/bin/keras-replicator demo

bench: install
	$(PY) -m benchmarks.strategy_overhead
	$(PY) -m benchmarks.step_overhead --png benchmarks/step_overhead.png
	$(PY) -m benchmarks.cross_replica_metrics_overhead
	$(PY) -m benchmarks.large_batch
	$(PY) -m benchmarks.large_batch_optimizers
	$(PY) -m benchmarks.spatial
	$(PY) -m benchmarks.weight_update_sharding --json benchmarks/weight_update_sharding.json --png benchmarks/weight_update_sharding.png
	$(PY) -m benchmarks.input_pipeline
	$(PY) -m benchmarks.pipeline
	$(PY) -m benchmarks.allreduce --fit
	$(PY) -m benchmarks.async_ps
	$(PY) -m benchmarks.layouts --json benchmarks/layouts.json --png benchmarks/layouts.png
	$(PY) -m benchmarks.machines --fit --json benchmarks/machines.json --png benchmarks/machines.png  # needs root

# The oldest and newest supported TensorFlow / Keras pairs (docs/compat.md), each
# in its own virtualenv (.venv-oldest: constraints/oldest.txt; .venv-newest:
# constraints/dev.txt): tests/test_compat.py, tests/_compat/ and the conformance
# suite on our strategies. Not part of `make test` or CI (about 10 minutes a pair on 2 cores).
COMPAT_FACTORIES := multi-device-2,multi-device-4,multi-worker-2

compat-range:
	$(MAKE) compat-pair PAIR=oldest PAIR_CONSTRAINTS=constraints/oldest.txt
	$(MAKE) compat-pair PAIR=newest PAIR_CONSTRAINTS=constraints/dev.txt

compat-pair:
	test -x .venv-$(PAIR)/bin/python || $(PYTHON) -m venv .venv-$(PAIR)
	.venv-$(PAIR)/bin/python -m pip install --quiet --upgrade pip
	.venv-$(PAIR)/bin/python -m pip install --quiet -c $(PAIR_CONSTRAINTS) -e ".[tensorflow,dev]"
	.venv-$(PAIR)/bin/keras-replicator env
	.venv-$(PAIR)/bin/python -m pytest -q tests/test_compat.py tests/_compat
	.venv-$(PAIR)/bin/keras-replicator test --factories $(COMPAT_FACTORIES)

clean:
	rm -rf $(VENV) .venv-oldest .venv-newest build *.egg-info

format: install
	$(PY) -m ruff check --fix keras_replicator tests benchmarks examples simulated_cluster
	$(PY) -m ruff format keras_replicator tests benchmarks examples simulated_cluster
