"""Hierarchical all-reduce between real worker processes on 127.0.0.1.

`MultiWorkerMirroredStrategy` gives a CPU worker one device (TensorFlow counts
only GPUs as local accelerators), so rows of the grid are modelled with
`group_size`: 2 workers in one row exercise the row collectives (scatter,
gather, broadcast) across processes; 4 workers as a 2 x 2 grid run every
sub-group of both schemes across processes, with the group and instance keys
each process derives on its own.
"""

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
    x, y = rng.normal(size=(256, 6)), rng.integers(0, 3, 256)
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
        x, y = rng.normal(size=(256, 6)), rng.integers(0, 3, 256)
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


def _check(options, num_workers):
    initial, expected = _reference()
    command = [
        sys.executable,
        "-c",
        TRAIN,
        json.dumps(options),
        json.dumps([w.tolist() for w in initial]),
    ]
    result = run_workers(command, num_workers, timeout=300, echo=False)
    assert result.ok, "\n".join(w.output[-2000:] for w in result.workers)
    weights = []
    for worker in result.workers:
        line = next(
            ln for ln in worker.output.splitlines() if ln.startswith("WEIGHTS ")
        )
        weights.append([np.asarray(w) for w in json.loads(line[len("WEIGHTS ") :])])
    for other in weights[1:]:
        for a, b in zip(weights[0], other):
            np.testing.assert_array_equal(a, b)  # workers agree bit for bit
    for e, g in zip(expected, weights[0]):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.timeout(360)
def test_two_workers_in_one_row_train_to_the_one_device_weights():
    _check({"hierarchy": "2d", "group_size": 2, "bucket_mb": 0.0005}, 2)


@pytest.mark.slow
@pytest.mark.timeout(480)
@pytest.mark.parametrize("hierarchy", ["local_then_global", "2d"])
def test_four_workers_as_a_2x2_grid_train_to_the_one_device_weights(hierarchy):
    _check({"hierarchy": hierarchy, "group_size": 2}, 4)
