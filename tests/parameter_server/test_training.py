"""ParameterServerReplicator: Keras 3 fit / evaluate / predict with real processes.

A chief, 2 workers and 1 parameter server on 127.0.0.1, started by
`keras_replicator.launch` (which also proves `--ps`: the serving tasks exit 0
when the chief is done). Async training is not bit-exact, so accuracy is
compared with one device within 4 points, not equal.
"""

import json
import sys
from pathlib import Path

import pytest

from keras_replicator.launch import launch

JOB = Path(__file__).with_name("ps_digits_job.py")


def run_job(tmp_path, *, num_ps=1, env=None, max_restarts=0, timeout=240):
    return launch(
        [sys.executable, str(JOB)],
        2,
        num_ps=num_ps,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
        max_restarts=max_restarts,
        timeout=timeout,
        cwd=str(tmp_path),
        echo=False,
        grace_seconds=3.0,
    )


def result_of(launch_result) -> dict:
    chief = launch_result.workers[launch_result.job_index]
    lines = [line for line in chief.output.splitlines() if line.startswith("RESULT ")]
    assert lines, launch_result.describe_failure()
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.timeout(300)
def test_fit_evaluate_predict_match_one_device(tmp_path):
    result = run_job(tmp_path, env={"KR_TEST_EPOCHS": "25"})
    assert result.ok, result.describe_failure()
    numbers = result_of(result)
    assert numbers["one_device_accuracy"] > 0.9
    # Async step order depends on timing. Alone, and 3 at a time beside 4 busy
    # loops, 15 runs ended within 3 of the 397 test digits of one device; CI's
    # two-process `make test` once ended 12 below (0.947 against 0.977). The
    # band allows 16 digits (4 points); an untrained or diverged model (about
    # 0.1) is far outside it. The exact checks below are the ones that must hold.
    assert numbers["accuracy"] > 0.93, numbers
    assert abs(numbers["accuracy"] - numbers["one_device_accuracy"]) <= 0.04, numbers
    assert numbers["predict_rows"] == 397
    assert numbers["predict_accuracy"] == pytest.approx(numbers["accuracy"], abs=1e-6)
    assert numbers["val_accuracy"] == pytest.approx(numbers["accuracy"], abs=1e-6)
    labels = [w.label for w in result.workers]
    assert labels == ["chief", "worker 0", "worker 1", "ps 0"]
    # The serving tasks were stopped after the chief and exited 0.
    assert all(w.returncode == 0 for w in result.workers), result.describe_failure()


@pytest.mark.slow(
    reason="covered in the default run by: test_fit_evaluate_predict_match_one_device"
)
@pytest.mark.multi_worker
@pytest.mark.timeout(200)
def test_fit_evaluate_predict_on_datasets_made_on_the_chief(tmp_path):
    # A dataset captured by a per-worker function failed on every worker with
    # "Failed copying input tensor ... Unable to parse tensor proto".
    result = run_job(
        tmp_path,
        env={"KR_TEST_INPUT": "dataset", "KR_TEST_EPOCHS": "8"},
        timeout=150,
    )
    assert result.ok, result.describe_failure()
    numbers = result_of(result)
    # What this test is about is that datasets work; the accuracy only shows
    # that training happened. Async staleness over 8 epochs moves it run to run
    # (0.945 against one device's 0.975 once), hence the wider band than the
    # arrays test's 20 epochs.
    assert numbers["accuracy"] > 0.9, numbers
    assert numbers["accuracy"] >= numbers["one_device_accuracy"] - 0.06, numbers
    assert numbers["predict_rows"] == 397
    assert numbers["predict_accuracy"] == pytest.approx(numbers["accuracy"], abs=1e-6)
    assert numbers["val_accuracy"] == pytest.approx(numbers["accuracy"], abs=1e-6)


@pytest.mark.slow(
    reason="covered in the default run by: "
    "test_custom_loop.py's tutorial, test_steps.py"
)
@pytest.mark.multi_worker
@pytest.mark.timeout(200)
def test_the_tutorials_fit_runs_and_counts_every_scheduled_step(tmp_path):
    # TF's PS tutorial: a dataset function, steps_per_execution=10, 5 x 20 steps.
    # Every step ran (an atomic counter said 100), but `optimizer.iterations`
    # said about 60: Keras' assign_add is a read then a write, lost in races.
    result = launch(
        [sys.executable, str(JOB.with_name("ps_count_job.py"))],
        2,
        num_ps=1,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=150,
        cwd=str(tmp_path),
        echo=False,
        grace_seconds=3.0,
    )
    assert result.ok, result.describe_failure()
    numbers = result_of(result)
    assert numbers == {"ran": 100, "iterations": 100, "batch_callbacks": 10}


def test_subclasses_the_stock_strategy_and_is_exported():
    import tensorflow as tf

    import keras_replicator as kr

    assert issubclass(
        kr.ParameterServerReplicator, tf.distribute.ParameterServerStrategy
    )
    assert "ParameterServerReplicator" in kr.__all__
