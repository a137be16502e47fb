"""ParameterServerReplicator under failures, with real processes (slow).

A worker SIGKILLed mid-training: the chief finishes (TensorFlow logs the failure and
re-runs its steps on the others), and the launcher restarts the worker to rejoin. A
parameter server SIGKILLed: the chief fails with a clear error, and the checkpoint
written before is intact. A worker or ps SIGSTOPped (hung): the chief fails within
KERAS_REPLICATOR_PS_TIMEOUT plus the probe, naming the task, and exits; nothing is
left running. The probe and the timeout setting are also tested without TensorFlow
processes (fast).
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import pytest

from keras_replicator.parameter_server import _faults
from tests.parameter_server.test_training import result_of, run_job


@pytest.mark.slow
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
    assert result.rejoins == 1
    chief = result.workers[result.job_index].output
    # The failure is TensorFlow's to log (our count of its put-back steps, a
    # patch of its closure queue, is gone: issue 50).
    assert "/job:worker/replica:0/task:1" in chief and "failed with" in chief
    assert numbers["accuracy"] > 0.9, numbers


@pytest.mark.slow
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


def _stop_task(tmp_path, task):
    """Runs the digits job with `task` SIGSTOPped mid-epoch 2; cleans up after."""
    started = time.monotonic()
    try:
        result = run_job(
            tmp_path,
            env={
                "KR_TEST_EPOCHS": "4",
                "KR_TEST_STOP": f"{task}:1",
                "KR_TEST_ONE_DEVICE": "0",
                "KERAS_REPLICATOR_PS_TIMEOUT": "10",
            },
            timeout=150,
        )
    finally:
        leftovers = []
        for pid_file in tmp_path.glob("*.pid"):
            pid = int(pid_file.read_text())
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
                leftovers.append(pid_file.stem)
            except ProcessLookupError:
                pass
    return result, time.monotonic() - started, leftovers


@pytest.mark.slow
@pytest.mark.multi_worker
@pytest.mark.timeout(200)
@pytest.mark.parametrize("task", ["ps 0", "worker 1"])
def test_a_hung_task_fails_the_chief_within_the_timeout(tmp_path, task):
    result, seconds, leftovers = _stop_task(tmp_path, task)
    assert not result.timed_out, result.describe_failure()
    chief = result.workers[result.job_index]
    assert chief.returncode == 1, result.describe_failure()
    assert "TimeoutError: No scheduled step finished or started for 10 s" in (
        chief.output
    ), result.describe_failure()
    assert f": {task} does not respond" in chief.output, result.describe_failure()
    # Start-up (~10 s) + epoch 1 + 10 s without progress + the probe (<= 6 s).
    assert seconds < 90, seconds
    assert leftovers == [], leftovers


def _strategy_with(cluster):
    resolver = types.SimpleNamespace(
        cluster_spec=lambda: types.SimpleNamespace(as_dict=lambda: cluster)
    )
    return types.SimpleNamespace(cluster_resolver=resolver)


def test_the_probe_names_silent_and_dead_tasks_and_not_live_ones():
    def listener():
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        return server

    silent, live, dead = listener(), listener(), listener()
    dead_port = dead.getsockname()[1]
    dead.close()
    with silent, live:
        # A "live" server answering anything, like gRPC's SETTINGS frame.
        def answer():
            connection, _ = live.accept()
            with connection:
                connection.recv(100)
                connection.sendall(bytes(9))

        threading.Thread(target=answer, daemon=True).start()
        strategy = _strategy_with(
            {
                "worker": [f"127.0.0.1:{live.getsockname()[1]}"],
                "ps": [
                    f"127.0.0.1:{silent.getsockname()[1]}",
                    f"127.0.0.1:{dead_port}",
                ],
            }
        )
        started = time.monotonic()
        silent_tasks = _faults.unresponsive_tasks(strategy, seconds=1.0)
    assert silent_tasks == ["ps 0", "ps 1"]
    assert time.monotonic() - started < 3.0


@pytest.mark.parametrize("raw", ["0", "-5", "soon", "nan"])
def test_a_bad_timeout_setting_is_named(monkeypatch, raw):
    monkeypatch.setenv("KERAS_REPLICATOR_PS_TIMEOUT", raw)
    with pytest.raises(ValueError, match="KERAS_REPLICATOR_PS_TIMEOUT"):
        _faults.timeout_seconds()


def test_the_timeout_defaults_to_60_seconds(monkeypatch):
    monkeypatch.delenv("KERAS_REPLICATOR_PS_TIMEOUT", raising=False)
    assert _faults.timeout_seconds() == 60.0
    monkeypatch.setenv("KERAS_REPLICATOR_PS_TIMEOUT", "2.5")
    assert _faults.timeout_seconds() == 2.5


_CATCHING_SCRIPT = """
import sys, types
from keras_replicator.parameter_server import _faults
coordinator = types.SimpleNamespace(_cluster=types.SimpleNamespace(stop=lambda: None))
try:
    _faults._cancel(coordinator)  # What `wait` does before raising TimeoutError.
    raise TimeoutError("a hung worker")
except TimeoutError:
    {handler}
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "handler, code", [("sys.exit(3)", 3), ("raise RuntimeError('giving up')", 1)]
)
def test_the_chief_script_keeps_its_exit_code_after_a_timeout(handler, code):
    # The atexit hook that skips TF's teardown used to exit with 0 after
    # `sys.exit(3)`: it cannot see the code, so `sys.exit` now records it.
    done = subprocess.run(
        [sys.executable, "-c", _CATCHING_SCRIPT.format(handler=handler)],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == code, done.stderr[-2000:]
    assert "exiting without TensorFlow's teardown" in done.stderr


@pytest.mark.parametrize(
    "recorded, status, uncaught, code",
    [
        (False, None, None, 0),
        (True, None, None, 0),
        (True, 3, None, 3),
        (True, 256 + 7, None, 7),
        (True, "bye", None, 1),
        (True, True, None, 1),
        (True, False, None, 0),
        (False, None, RuntimeError("x"), 1),
        (True, 3, ValueError("later"), 1),
    ],
)
def test_exit_code_is_what_python_would_exit_with(recorded, status, uncaught, code):
    assert _faults.exit_code(recorded, status, uncaught) == code
