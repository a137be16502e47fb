"""`run_steps` / `distribute_input` on the ParameterServerReplicator, real processes.

A chief, 2 workers and 1 ps on 127.0.0.1: 201 asynchronous steps of a custom
`step_fn` fit a linear regression; the weights must reach the known solution.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from keras_replicator.launch import launch

JOB = str(Path(__file__).with_name("ps_steps_job.py"))


@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_run_steps_are_scheduled_on_the_workers_and_train(tmp_path):
    result = launch(
        [sys.executable, JOB],
        2,
        num_ps=1,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=240,
        cwd=str(tmp_path),
        echo=False,
        grace_seconds=3.0,
    )
    assert result.ok, result.describe_failure()
    chief = result.workers[result.job_index]
    [line] = [x for x in chief.output.splitlines() if x.startswith("RESULT ")]
    numbers = json.loads(line[len("RESULT ") :])
    assert numbers["first_loss"] > 1.0
    assert numbers["last_loss"] < 1e-4 * numbers["first_loss"]
    np.testing.assert_allclose(numbers["kernel"], numbers["true"], atol=1e-3)
