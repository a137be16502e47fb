"""MultiWorkerReplicator in real worker processes on 127.0.0.1."""

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
        ("default", "socket"),
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


BAD_TF_CONFIG = textwrap.dedent(
    """
    import json, os
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 3}}
    )
    import keras_replicator as kr
    try:
        kr.MultiWorkerReplicator()
    except ValueError as error:
        print("ERROR", error)
    """
)


def test_bad_tf_config_names_the_field():
    result = run_workers([sys.executable, "-c", BAD_TF_CONFIG], 1, echo=False)
    assert "ERROR `TF_CONFIG['task']['index']` must be an integer in [0, 1)" in (
        result.workers[0].output
    )


def test_bad_collective_timeout():
    code = (
        "import keras_replicator as kr\n"
        "try:\n"
        "    kr.MultiWorkerReplicator(collective_timeout=0)\n"
        "except ValueError as error:\n"
        "    print('ERROR', error)\n"
    )
    result = run_workers([sys.executable, "-c", code], 1, echo=False)
    assert "Received: collective_timeout=0" in result.workers[0].output
