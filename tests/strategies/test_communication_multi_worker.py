"""The socket transport and compression between real worker processes (127.0.0.1)."""

import json
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.launch import run_workers

pytestmark = pytest.mark.multi_worker

TRAIN = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras, numpy as np
    import keras_replicator as kr
    options = kr.AllReduceOptions(**json.loads(sys.argv[1]))
    strategy = kr.MultiWorkerReplicator(collective_timeout=60, all_reduce=options)
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(300, 6)), rng.integers(0, 3, 300)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((6,)),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(3),
        ])
        model.compile(
            keras.optimizers.SGD(0.1, momentum=0.9),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.set_weights([np.asarray(w) for w in json.loads(sys.argv[2])])
    model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    print("WEIGHTS " + json.dumps([w.tolist() for w in model.get_weights()]))
    """
)


def _reference():
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(300, 6)), rng.integers(0, 3, 300)
        keras.utils.set_random_seed(0)
        with tf.distribute.get_strategy().scope():
            model = keras.Sequential(
                [
                    keras.Input((6,)),
                    keras.layers.Dense(16, activation="tanh"),
                    keras.layers.Dense(3),
                ]
            )
        model.compile(
            keras.optimizers.SGD(0.1, momentum=0.9),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        initial = model.get_weights()
        model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
        return initial, model.get_weights()
    finally:
        keras.config.set_floatx("float32")
        keras.config.set_dtype_policy("float32")


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "options, rtol",
    [
        ({"transport": "socket", "bucket_mb": 0.0005}, 1e-10),
        ({"compression": "bf16"}, 0),
    ],
    ids=["socket-exact", "bf16-collective"],
)
def test_two_workers_train_to_the_one_device_weights(options, rtol):
    initial, expected = _reference()
    command = [
        sys.executable,
        "-c",
        TRAIN,
        json.dumps(options),
        json.dumps([w.tolist() for w in initial]),
    ]
    result = run_workers(command, 2, timeout=200, echo=False)
    assert result.ok, "\n".join(w.output[-2000:] for w in result.workers)
    weights = []
    for worker in result.workers:
        line = next(
            ln for ln in worker.output.splitlines() if ln.startswith("WEIGHTS ")
        )
        weights.append([np.asarray(w) for w in json.loads(line[len("WEIGHTS ") :])])
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)  # workers agree bit for bit
    for e, g in zip(expected, weights[0]):
        if rtol:
            np.testing.assert_allclose(g, e, rtol=rtol, atol=1e-12)
        else:  # bf16 wire: within 2% of the largest weight
            np.testing.assert_allclose(g, e, atol=2e-2 * np.max(np.abs(e)))
