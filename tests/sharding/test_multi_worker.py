"""Sharded updates between real worker processes on 127.0.0.1, over the socket ring.

Two workers train the float64 model of `_training` for 20 steps, sharded and
not, from the same initial weights, saving a `.keras` file after step 10:

- weights and optimizer state equal the unsharded run's (<= 1e-12);
- the ring sends the unsharded all-reduce's bytes, within padding;
- the sharded file, loaded on one device and on 4 logical CPUs (sharded),
  continues to the uninterrupted run's weights.
"""

import json
import os
import sys
import textwrap

import keras
import numpy as np
import pytest

import keras_replicator as kr
from keras_replicator.launch import run_workers
from tests.sharding import _training as t

pytestmark = pytest.mark.multi_worker

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras, numpy as np
    import keras_replicator as kr
    from keras_replicator._replicator_state import replicator_state
    from tests.sharding import _training as t
    from tests.sharding.test_multi_worker import OPTIMIZERS
    shard, name, save_dir = sys.argv[1] == "1", sys.argv[2], sys.argv[3]
    options = kr.AllReduceOptions(shard_weight_update=shard)
    strategy = kr.MultiWorkerReplicator(collective_timeout=60, all_reduce=options)
    keras.config.set_floatx("float64")
    model = t.model_in(strategy, OPTIMIZERS[name])
    t.fit(model, epochs=1)
    ring = replicator_state(strategy).transport.ring
    print("BYTES", ring.bytes_sent, flush=True)
    model.save(os.path.join(save_dir, "after_one_epoch.keras"))
    t.fit(model, epochs=1)
    print("TRANSPORT " + strategy.all_reduce_options.transport)
    print("WEIGHTS " + json.dumps([w.tolist() for w in t.weights(model)]))
    state = [np.asarray(s).tolist() for s in t.optimizer_state(model)]
    print("STATE " + json.dumps(state))
    """
)

OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "lars": lambda: kr.optimizers.LARS(0.5, momentum=0.9, weight_decay=1e-3, eeta=0.01),
    "lamb": lambda: keras.optimizers.Lamb(0.01, weight_decay=0.01),
}


def _train(shard, name, save_dir):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = run_workers(
        [sys.executable, "-c", _SCRIPT, "1" if shard else "0", name, str(save_dir)],
        2,
        timeout=200,
        echo=False,
        env={"PYTHONPATH": root},
    )
    assert not result.timed_out
    found = []
    for worker in result.workers:
        assert worker.returncode == 0, worker.output[-3000:]
        lines = dict(
            line.split(" ", 1) for line in worker.output.splitlines() if " " in line
        )
        assert lines["TRANSPORT"] == "socket"
        found.append(
            {
                "bytes": int(lines["BYTES"]),
                "weights": [np.asarray(w) for w in json.loads(lines["WEIGHTS"])],
                "state": [np.asarray(s) for s in json.loads(lines["STATE"])],
            }
        )
    assert t.max_difference(found[0]["weights"], found[1]["weights"]) == 0.0
    return found[0]


@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    "name",
    [
        "sgd_momentum",
        pytest.param("lars", marks=pytest.mark.slow),
        pytest.param("adam", marks=pytest.mark.slow),
        pytest.param("lamb", marks=pytest.mark.slow),
    ],
)
def test_two_workers_sharded_equal_unsharded_and_resume_anywhere(name, tmp_path):
    plain = _train(False, name, tmp_path / "plain")
    sharded = _train(True, name, tmp_path / "sharded")
    assert t.max_difference(plain["weights"], sharded["weights"]) <= 1e-12
    assert t.max_difference(plain["state"], sharded["state"]) <= 1e-12
    # Wire: the same bytes as the all-reduce, within padding (one element per
    # variable and worker, 4 variables here) and the sample count's copies;
    # LARS and Lamb add one all-reduce of 2 float64 sums of squares per variable.
    steps, variables = 10, 4
    padding = steps * 2 * variables * 8
    norms = steps * variables * 2 * 8 if name in ("lars", "lamb") else 0
    extra = sharded["bytes"] - plain["bytes"]
    assert abs(extra - norms) <= padding, (plain["bytes"], sharded["bytes"])

    path = str(tmp_path / "sharded" / "after_one_epoch.keras")
    keras.config.set_floatx("float64")  # before loading: the loss takes floatx
    try:
        one_device = keras.models.load_model(path)
        t.fit(one_device, epochs=1)
        # One device sums in another order; Adam and Lamb divide by sqrt(v),
        # which amplifies the last bit (tests/sharding/test_saving.py).
        tolerance = 1e-9 if name in ("adam", "lamb") else 1e-12
        difference = t.max_difference(t.weights(one_device), sharded["weights"])
        assert difference <= tolerance
        four = kr.MultiDeviceReplicator(
            num_replicas=4, all_reduce=kr.AllReduceOptions(shard_weight_update=True)
        )
        with four.scope():
            resumed = keras.models.load_model(path)
        t.fit(resumed, epochs=1)
        assert t.max_difference(t.weights(resumed), sharded["weights"]) <= 1e-12
    finally:
        keras.config.set_floatx("float32")
