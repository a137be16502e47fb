"""Pipeline x data parallelism: 2 worker processes x 2 stages equal one device."""

import json
import sys
import textwrap

import pytest

from keras_replicator.launch import run_workers

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow]

WORKER = textwrap.dedent(
    """
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras_replicator as kr
    kr.split_cpu(2)
    import keras, numpy as np, tensorflow as tf

    strategy = kr.MultiWorkerReplicator(collective_timeout=60)

    def build():
        keras.utils.set_random_seed(1)
        return keras.Sequential([
            keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])

    rng = np.random.default_rng(0)
    x = rng.random((64, 6)).astype("float32")
    y = rng.random((64, 3)).astype("float32")
    reference = build()
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    reference.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)

    with strategy.scope():
        pipe = kr.pipeline.GPipe(build(), balance=[2, 1], num_microbatches=2,
                                 checkpoint="always")
        pipe.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    pipe.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=3, verbose=0)
    difference = max(float(np.abs(a - b).max())
                     for a, b in zip(reference.get_weights(), pipe.get_weights()))
    print("RESULT " + json.dumps({"difference": difference, "devices": pipe.devices}))
    """
)


@pytest.mark.timeout(300)
def test_two_workers_by_two_stages_train_like_one_device():
    result = run_workers([sys.executable, "-c", WORKER], 2, timeout=240, echo=False)
    for worker in result.workers:
        assert worker.returncode == 0, worker.output
        line = [x for x in worker.output.splitlines() if x.startswith("RESULT ")][-1]
        report = json.loads(line[len("RESULT ") :])
        assert report["devices"] == ["/cpu:0", "/cpu:1"]
        assert report["difference"] < 1e-5, report
