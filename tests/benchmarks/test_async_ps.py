"""The pure helpers of benchmarks/async_ps.py and its straggler pipeline (fast)."""

import json
import time

import numpy as np
import pytest

from benchmarks import async_ps as bench


def test_parse_stamps_groups_by_task_and_strips_tf_print_quotes():
    text = '"worker 1" 3000000\n"worker 0" 1000000\n"worker 1" 2000000\nnoise\n'
    assert bench.parse_stamps(text) == {"worker 1": [2.0, 3.0], "worker 0": [1.0]}


def test_median_interval_skips_warm_up():
    times = [0.0, 5.0, 6.0, 6.1, 6.2, 6.3]
    assert bench.median_interval(times, skip=2) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="at least 5 stamps"):
        bench.median_interval(times[:4], skip=2)


def test_steady_epoch_seconds_ignores_the_first_epoch():
    assert bench.steady_epoch_seconds([0.0, 10.0, 11.0, 12.5, 13.5]) == 1.0
    with pytest.raises(ValueError, match="--epochs 3"):
        bench.steady_epoch_seconds([0.0, 1.0])


def test_sleep_for():
    assert bench.sleep_for(0.01, 3) == pytest.approx(0.03)
    with pytest.raises(ValueError, match="slowdown"):
        bench.sleep_for(0.01, 0.5)


def test_interval_rate_adds_async_workers_and_waits_for_sync_stragglers():
    intervals = {"worker 0": 0.01, "worker 1": 0.03}
    assert bench.interval_rate("async", intervals) == pytest.approx(32 * 133.33, 1e-3)
    assert bench.interval_rate("sync", {"worker 0": 0.03, "worker 1": 0.03}) == (
        pytest.approx(64 / 0.03)
    )


def test_table_compares_async_with_sync_at_the_same_straggler():
    row = {
        "updates_per_s": 1.0,
        "accuracy": 0.95,
        "sleep_s": 0.03,
        "fast_step_s": 0.01,
        "straggler_step_s": 0.03,
        "step_s": 0.02,
        "interval_examples_per_s": 50.0,
    }
    runs = {
        "sync": [{**row, "examples_per_s": 100.0, "sleep_s": 0.0}],
        "sync, straggler S": [{**row, "examples_per_s": 40.0, "straggler_factor": 3}],
        "async, straggler S": [
            {**row, "examples_per_s": 70.0, "straggler_factor": 2.9},
            {**row, "examples_per_s": 90.0, "straggler_factor": 3.1},
        ],
    }
    summary = bench.summarize(runs)
    assert summary["async, straggler S"]["examples_per_s"] == 80.0
    assert summary["async, straggler S"]["rounds"] == 2
    text = bench.table(summary, 3)
    assert "| async, straggler 3x sync step | 30.0 ms | 10.0 / 30.0 | 3.00x | 80 |" in (
        text
    )
    assert "| 80 | 2.00x | 50 | 1.00x | 1.0 | 95.00 % |" in text
    json.dumps(summary)  # what the benchmark saves


def test_task_of_reads_tf_config_from_a_process_environment():
    import tensorflow as tf

    config = {
        "cluster": {"worker": ["a:1", "b:2"]},
        "task": {"type": "worker", "index": 1},
    }
    environ = f"PATH=/bin\0TF_CONFIG={json.dumps(config)}\0HOME=/root\0"
    assert bench.task_of(tf.constant(environ)).numpy() == b"worker 1"
    assert bench.task_of(tf.constant("PATH=/bin\0")).numpy() == b"local"


def test_pipeline_stamps_every_batch(tmp_path):
    x = np.zeros((96, 64), "float32")
    y = np.zeros(96, "int32")
    stamps = tmp_path / "stamps.txt"
    dataset = bench.pipeline(x, y, sleep_us=0, stamp_file=str(stamps))
    batches = list(dataset.take(3))
    assert batches[0][0].shape == (32, 64)
    assert len(bench.parse_stamps(stamps.read_text())["local"]) >= 3


def test_sleep_each_delays_every_element():
    import tensorflow as tf

    dataset = bench._sleep_each(tf.data.Dataset.range(3), 50_000)
    start = time.perf_counter()
    assert [int(v) for v in dataset] == [0, 1, 2]
    assert time.perf_counter() - start >= 0.15
