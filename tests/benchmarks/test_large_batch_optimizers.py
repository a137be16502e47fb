"""The pure helpers of benchmarks/large_batch_optimizers.py (fast, no TensorFlow)."""

import argparse

import pytest

from benchmarks import large_batch_optimizers as bench


def _args(**overrides):
    values = {
        "multipliers": "1,16,extreme",
        "base_learning_rate": 0.05,
        "lamb_learning_rate": 0.002,
        "neumann_learning_rate": None,
        "warmup_epochs": 5.0,
    }
    return argparse.Namespace(**{**values, **overrides})


def test_configurations_scale_the_rates_and_warm_up_above_x1():
    configs = bench.configurations(_args(), train_size=4000)
    assert len(configs) == 3 * len(bench.RECIPES)
    by_name = {c.name: c for c in configs}
    assert by_name["SGD @ batch 32"].peak_learning_rate == 0.05
    assert by_name["SGD @ batch 512"].peak_learning_rate == pytest.approx(0.8)
    assert by_name["SGD @ batch 512"].warmup_epochs == 0
    assert by_name["LARS + warmup @ batch 512"].warmup_epochs == 5.0
    assert by_name["LARS + warmup @ batch 32"].warmup_epochs == 0
    lamb = by_name["LAMB + warmup @ batch 512"].peak_learning_rate
    assert lamb == pytest.approx(0.002 * 4)  # square-root scaling
    extreme = by_name["NLCG @ batch 2000"]
    assert extreme.multiplier == 2000 / 32  # half of the training set
    neumann = bench.configurations(_args(neumann_learning_rate=0.01), 4000)
    assert {c.name: c for c in neumann}["Neumann @ batch 512"].peak_learning_rate == (
        pytest.approx(0.16)
    )


def test_summary_compares_with_the_x1_sgd_run_of_the_same_run():
    configs = bench.configurations(_args(multipliers="1,16"), train_size=4000)
    runs = {c.name: [{"test_accuracy": 50.0, "seconds": 1.0}] * 2 for c in configs}
    runs["SGD @ batch 32"] = [{"test_accuracy": a, "seconds": 2.0} for a in (60, 62)]
    runs["LARS + warmup @ batch 512"] = [
        {"test_accuracy": a, "seconds": 1.0} for a in (55, 57)
    ]
    rows = {(r["recipe"], r["batch"]): r for r in bench.summarize(configs, runs)}
    lars = rows[("LARS + warmup", 512)]
    assert lars["mean"] == 56 and lars["diff"] == -5 and lars["ratio"] == 56 / 61
    assert lars["std"] == pytest.approx(2**0.5)
    assert rows[("SGD", 32)]["diff"] == 0
