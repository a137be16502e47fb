"""Shared-memory payloads between real worker processes on one machine (23, 34)."""

import hashlib
import os
import sys
import textwrap

import pytest

from keras_replicator.communication.ring import _shared_memory
from keras_replicator.launch import run_workers

pytestmark = pytest.mark.multi_worker

TRAIN = textwrap.dedent(
    """
    import hashlib, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras, numpy as np
    import keras_replicator as kr
    keras.utils.set_random_seed(0)
    from keras_replicator.testing import _workloads
    strategy = kr.MultiWorkerReplicator(collective_timeout=60)
    from keras_replicator._replicator_state import replicator_state
    link = replicator_state(strategy).transport.ring._link
    print("LINK", link.outbox is not None, link.inbox is not None, flush=True)
    maps = open("/proc/self/maps").read()
    print("MAPPED", maps.count("memfd:krring"), maps.count("/dev/shm/"), flush=True)
    fds = [os.readlink(f"/proc/self/fd/{n}") for n in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{n}")]
    print("OPEN", sum("krring" in f for f in fds), flush=True)
    print("PID", os.getpid(), flush=True)
    with strategy.scope():
        model = _workloads.mlp()
    x, y = _workloads.classification_data(512)
    model.fit(x, y, batch_size=128, epochs=2, verbose=0)
    weights = b"".join(np.asarray(w).tobytes() for w in model.get_weights())
    print("WEIGHTS", hashlib.sha256(weights).hexdigest(), flush=True)
    """
)


def _train(shared_memory: str):
    env = {_shared_memory.ENVIRONMENT_VARIABLE: shared_memory}
    result = run_workers(
        [sys.executable, "-c", TRAIN], 2, timeout=240, echo=False, env=env
    )
    assert not result.timed_out
    lines = {}
    for worker in result.workers:
        assert worker.returncode == 0, worker.output[-3000:]
        for line in worker.output.splitlines():
            for key in ("LINK", "MAPPED", "OPEN", "WEIGHTS", "PID"):
                if line.startswith(key + " "):
                    lines.setdefault(key, []).append(line[len(key) + 1 :])
    return lines


@pytest.mark.timeout(300)
def test_workers_on_one_machine_share_memory_and_train_to_the_socket_rings_bits():
    shared = _train("1")
    assert shared["LINK"] == ["True True"] * 2  # both directions of both links
    # Anonymous memfds (an outbox and an inbox each), no file of /dev/shm, and
    # no descriptor left that another process could open (issue 34).
    assert shared["MAPPED"] == ["2 0"] * 2
    assert shared["OPEN"] == ["0"] * 2
    sockets = _train("0")
    assert sockets["LINK"] == ["False False"] * 2
    assert len(set(shared["WEIGHTS"])) == 1  # the workers agree
    assert shared["WEIGHTS"] == sockets["WEIGHTS"]  # and add as the sockets do
    assert hashlib.sha256(b"").hexdigest() not in shared["WEIGHTS"]
    theirs = tuple(f"krring-{pid}-" for pid in shared["PID"] + sockets["PID"])
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(theirs)]
