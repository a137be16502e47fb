"""MultiWorkerReplicator in real worker processes on 127.0.0.1."""

import functools
import sys
import textwrap

import pytest

from keras_replicator.launch import run_workers

pytestmark = pytest.mark.multi_worker

DEAD_PEER = textwrap.dedent(
    """
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras_replicator as kr
    from keras_replicator.testing import _workloads
    transport = {"default": None}.get(sys.argv[1], sys.argv[1])
    strategy = kr.MultiWorkerReplicator(
        collective_timeout=10, all_reduce=kr.AllReduceOptions(transport=transport)
    )
    print("TRANSPORT", strategy.all_reduce_options.transport, flush=True)
    if os.environ["KERAS_REPLICATOR_WORKER_INDEX"] == "1":
        os._exit(0)  # a peer that vanishes without a word
    with strategy.scope():
        model = _workloads.mlp()
    x, y = _workloads.classification_data(256)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    print("FINISHED")
    """
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "transport, used",
    [
        pytest.param(
            "default",
            "socket",
            marks=pytest.mark.slow(
                reason="covered in the default run by: "
                "tests/communication/test_socket_ring.py::test_a_dead_peer_is_an_error"
            ),
        ),
        pytest.param("collective", "collective", marks=pytest.mark.slow),
    ],
)
def test_a_dead_peer_is_an_error_not_a_hang(transport, used):
    result = run_workers(
        [sys.executable, "-c", DEAD_PEER, transport], 2, timeout=240, echo=False
    )
    survivor = result.workers[0]
    assert f"TRANSPORT {used}" in survivor.output
    assert not result.timed_out, "the survivor hung instead of failing"
    assert survivor.returncode != 0
    assert "FINISHED" not in survivor.output


# Both refusals in one worker process (one TensorFlow start, not two): first
# `collective_timeout=0` under the launcher's TF_CONFIG, then a bad TF_CONFIG.
BAD_ARGUMENTS = textwrap.dedent(
    """
    import json, os
    import keras_replicator as kr
    try:
        kr.MultiWorkerReplicator(collective_timeout=0)
    except ValueError as error:
        print("TIMEOUT ERROR", error)
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 3}}
    )
    try:
        kr.MultiWorkerReplicator()
    except ValueError as error:
        print("TF_CONFIG ERROR", error)
    """
)


@functools.cache
def _bad_arguments_output():
    result = run_workers([sys.executable, "-c", BAD_ARGUMENTS], 1, echo=False)
    return result.workers[0].output


def test_bad_tf_config_names_the_field():
    expected = "`TF_CONFIG['task']['index']` must be an integer in [0, 1)"
    assert f"TF_CONFIG ERROR {expected}" in _bad_arguments_output()


def test_bad_collective_timeout():
    output = _bad_arguments_output()
    assert "TIMEOUT ERROR" in output
    timeout_error = output.split("TIMEOUT ERROR", 1)[1].split("TF_CONFIG ERROR")[0]
    assert "Received: collective_timeout=0" in timeout_error


LEAVING = textwrap.dedent(
    """
    import os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras_replicator as kr
    from keras_replicator.testing import _workloads
    strategy = kr.MultiWorkerReplicator(collective_timeout=30)
    with strategy.scope():
        model = _workloads.mlp()
    x, y = _workloads.classification_data(128)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    if os.environ["KERAS_REPLICATOR_WORKER_INDEX"] == sys.argv[1]:
        time.sleep(11)  # past a heartbeat timeout: the other must not log a crash
    print("FINISHED", flush=True)
    """
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "late", ["1", pytest.param("0", marks=pytest.mark.slow)], ids=["chief", "worker"]
)
def test_a_clean_run_logs_no_tensorflow_error_at_exit(late):
    # Before: "BaseCollectiveExecutor::StartAbort UNAVAILABLE ... Failed to send
    # RPC to coordination service" (worker 1, when worker 0 left first) or "...
    # tasks are unhealthy (stopped sending heartbeats)" (worker 0).
    result = run_workers(
        [sys.executable, "-c", LEAVING, late], 2, timeout=240, echo=False
    )
    assert not result.timed_out
    for worker in result.workers:
        assert worker.returncode == 0, worker.output[-2000:]
        assert "FINISHED" in worker.output
        errors = [
            line
            for line in worker.output.splitlines()
            if line.startswith("E0000") and "cuInit" not in line
        ]
        assert not errors, errors
