"""ParameterServerReplicator: Keras 3 fit / evaluate / predict with real processes.

A chief, 2 workers and 1 parameter server on 127.0.0.1, started by
`keras_replicator.launch` (which also proves `--ps`: the serving tasks exit 0
when the chief is done). Async training is not bit-exact, so accuracy is
compared with one device within 1 point, not equal.
"""

import json
import sys
from pathlib import Path

import pytest

from keras_replicator.launch import launch

JOB = str(Path(__file__).with_name("ps_digits_job.py"))


def run_job(tmp_path, *, num_ps=1, env=None, max_restarts=0, timeout=240):
    return launch(
        [sys.executable, JOB],
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
def test_fit_evaluate_predict_match_one_device_within_a_point(tmp_path):
    result = run_job(tmp_path, env={"KR_TEST_EPOCHS": "25"})
    assert result.ok, result.describe_failure()
    numbers = result_of(result)
    assert numbers["one_device_accuracy"] > 0.9
    assert abs(numbers["accuracy"] - numbers["one_device_accuracy"]) <= 0.01, numbers
    assert numbers["predict_rows"] == 397
    assert numbers["predict_accuracy"] == pytest.approx(numbers["accuracy"], abs=1e-6)
    assert numbers["val_accuracy"] == pytest.approx(numbers["accuracy"], abs=1e-6)
    labels = [w.label for w in result.workers]
    assert labels == ["chief", "worker 0", "worker 1", "ps 0"]
    # The serving tasks were stopped after the chief and exited 0.
    assert all(w.returncode == 0 for w in result.workers), result.describe_failure()


def test_subclasses_the_stock_strategy_and_is_exported():
    import tensorflow as tf

    import keras_replicator as kr

    assert issubclass(
        kr.ParameterServerReplicator, tf.distribute.ParameterServerStrategy
    )
    assert "ParameterServerReplicator" in kr.__all__
