# Every target installs what it needs into .venv from pyproject.toml's pins.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install lint format test test-slow notebooks conformance clients demo bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,demo,notebooks]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(PY) -m ruff check keras_replicator tests benchmarks examples
	$(PY) -m ruff format --check keras_replicator tests benchmarks examples

test: lint
	$(PY) -m pytest -q --durations=25

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
	$(PY) benchmarks/strategy_overhead.py
	$(PY) benchmarks/step_overhead.py --png benchmarks/step_overhead.png
	$(PY) benchmarks/cross_replica_metrics_overhead.py
	$(PY) benchmarks/large_batch.py
	$(PY) benchmarks/large_batch_optimizers.py
	$(PY) benchmarks/spatial.py
	$(PY) benchmarks/weight_update_sharding.py --json benchmarks/weight_update_sharding.json --png benchmarks/weight_update_sharding.png
	$(PY) benchmarks/input_pipeline.py
	$(PY) benchmarks/pipeline.py
	$(PY) benchmarks/allreduce.py --fit
	$(PY) benchmarks/async_ps.py

clean:
	rm -rf $(VENV) build *.egg-info

format: install
	$(PY) -m ruff check --fix keras_replicator tests benchmarks examples
	$(PY) -m ruff format keras_replicator tests benchmarks examples
