"""ParameterServerReplicator under failures, with real processes (slow).

A worker SIGKILLed mid-training: the chief finishes, counts the lost steps, and the
launcher restarts the worker to rejoin. A parameter server SIGKILLed: the chief
fails with a clear error, and the checkpoint written before is intact.
"""

import pytest

from tests.parameter_server.test_training import result_of, run_job

pytestmark = pytest.mark.slow


@pytest.mark.timeout(420)
def test_a_killed_worker_is_rescheduled_around_and_rejoins(tmp_path):
    result = run_job(
        tmp_path,
        env={
            "KR_TEST_EPOCHS": "6",
            "KR_TEST_KILL": "worker 1:2",
            "KR_TEST_ONE_DEVICE": "0",
        },
        max_restarts=1,
        timeout=400,
    )
    assert result.ok, result.describe_failure()
    numbers = result_of(result)
    assert numbers["lost_steps"] > 0, numbers
    assert result.rejoins == 1
    chief = result.workers[result.job_index].output
    assert "were lost with a failed worker and re-run on the others" in chief
    assert numbers["accuracy"] > 0.9, numbers


@pytest.mark.timeout(420)
def test_a_killed_parameter_server_fails_the_job_clearly(tmp_path):
    checkpoint = tmp_path / "last.weights.h5"
    result = run_job(
        tmp_path,
        env={
            "KR_TEST_EPOCHS": "6",
            "KR_TEST_KILL": "ps 0:3",
            "KR_TEST_ONE_DEVICE": "0",
            "KR_TEST_CHECKPOINT": str(checkpoint),
        },
        timeout=400,
    )
    assert not result.ok and not result.timed_out, result.describe_failure()
    chief = result.workers[result.job_index]
    assert "Parameter server ps 0 stopped responding" in chief.output, (
        result.describe_failure()
    )
    assert checkpoint.exists()
    import h5py

    with h5py.File(checkpoint, "r") as weights:
        assert len(weights.keys()) > 0
