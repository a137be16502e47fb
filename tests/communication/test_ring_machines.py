"""4 worker processes on 2 simulated machines (issue 37; `simulated_cluster`).

The machines are network namespaces joined by a bridge (each with its own
`/dev/shm`), the workers listed h1, h2, h1, h2 in `TF_CONFIG`, as schedulers may
list them. Skipped where the machine cannot make namespaces (not root).
"""

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import simulated_cluster as simulated

pytestmark = pytest.mark.timeout(300)

MACHINES = [0, 1, 0, 1]  # worker i runs on machine MACHINES[i]

_TRAIN = textwrap.dedent(
    """
    import json, os, sys
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras, numpy as np
    keras.backend.set_floatx("float64")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 20)); y = rng.integers(0, 4, 96)

    def model():
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64,
            activation="relu"), keras.layers.Dense(4)])
        model.compile(keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    found = {}
    if "TF_CONFIG" in os.environ:
        import keras_replicator as kr
        from keras_replicator._replicator_state import replicator_state
        from keras_replicator.communication.ring import _hierarchical
        strategy = kr.MultiWorkerReplicator()
        ring = replicator_state(strategy).transport.ring
        grid = isinstance(ring, _hierarchical.HierarchicalRing)
        flat = ring.flat if grid else ring
        found = {"order": flat.order, "grid": grid,
                 "flat_shared": [flat._link.outbox is not None,
                                 flat._link.inbox is not None]}
        if grid:
            found["row_shared"] = ring.row._link.inbox is not None
            found["column_shared"] = ring.column._link.inbox is not None
        with strategy.scope():
            trained = model()
    else:
        trained = model()
    trained.fit(x, y, batch_size=24, epochs=2, shuffle=False, verbose=0)
    found["weights"] = [w.tolist() for w in trained.get_weights()]
    print("RESULT " + json.dumps(found), flush=True)
    """
)


def _result(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _train_on(cluster, environment=None) -> list[dict]:
    workers = [f"{cluster.address(m)}:{23400 + i}" for i, m in enumerate(MACHINES)]
    processes = []
    for index, machine in enumerate(MACHINES):
        env = dict(os.environ, **(environment or {}))
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        env["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        )
        processes.append(
            cluster.popen(
                machine,
                [sys.executable, "-c", _TRAIN],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=180)[0] for p in processes]
    assert [p.returncode for p in processes] == [0] * 4, outputs[0][-3000:]
    return [_result(output) for output in outputs]


def _digest(weights) -> str:
    return hashlib.sha256(
        b"".join(np.asarray(w, np.float64).tobytes() for w in weights)
    ).hexdigest()


@pytest.mark.slow(
    reason="covered in the default run by: test_ring_grid.py (rows and columns "
    "across machines, workers as threads), test_shared_memory_multi_worker.py"
)
def test_four_workers_on_two_machines_train_like_one_device():
    reason = simulated.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    one_device = subprocess.run(
        [sys.executable, "-c", _TRAIN],
        env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    expected = _result(one_device.stdout + one_device.stderr)["weights"]
    with simulated.SimulatedCluster(hosts=2) as cluster:
        grid = _train_on(cluster)  # the default: rows and columns
        flat = _train_on(cluster, {"KERAS_REPLICATOR_RING_HIERARCHY": "0"})
    for runs, is_grid in ((grid, True), (flat, False)):
        # Machine by machine: workers 0, 2 on machine 0, then 1, 3 on machine 1.
        assert [run["order"] for run in runs] == [[0, 2, 1, 3]] * 4
        assert [run["grid"] for run in runs] == [is_grid] * 4
        # Every worker's weights are bit for bit the others'.
        assert len({_digest(run["weights"]) for run in runs}) == 1
        for got, want in zip(runs[0]["weights"], expected):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    # The flat ring: shared memory on the links inside a machine only (each
    # worker sends to or receives from its machine's other worker, not both).
    assert [run["flat_shared"] for run in flat] == [
        [True, False],  # worker 0 -> 2 (machine 0), receives from 3
        [True, False],  # worker 1 -> 3 (machine 1), receives from 2
        [False, True],  # worker 2 -> 1 crosses; receives from 0
        [False, True],
    ]
    # The grid: rows through shared memory, columns through sockets.
    assert all(run["row_shared"] and not run["column_shared"] for run in grid)
    for a, b in zip(grid[0]["weights"], flat[0]["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
