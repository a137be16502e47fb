"""A float64 MLP trained under `kr.AllReduceOptions` on real workers and on one device.

Shared by the multi-worker tests of the communication layer: `train_on_workers`
runs the same `fit` in `num_workers` processes on 127.0.0.1 from the one-device
run's initial weights; `one_device` gives those weights and the expected result.
"""

import json
import sys
import textwrap

import keras
import numpy as np
import tensorflow as tf

from keras_replicator.launch import run_workers

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras, numpy as np
    import keras_replicator as kr
    from tests.communication._options_training import build, data
    if os.environ["KERAS_REPLICATOR_WORKER_INDEX"] in sys.argv[4].split(","):
        from keras_replicator.communication.ring import _setup
        _setup.listen = lambda strategy: (None, [0.0] * 5, "made to fail")
    options = kr.AllReduceOptions(**json.loads(sys.argv[1]))
    strategy = kr.MultiWorkerReplicator(collective_timeout=60, all_reduce=options)
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    x, y = data(int(sys.argv[3]))
    with strategy.scope():
        model = build()
    model.set_weights([np.asarray(w) for w in json.loads(sys.argv[2])])
    if sys.argv[5] == "eager":
        model.compile(model.optimizer, model.loss, run_eagerly=True)
    model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    print("TRANSPORT " + strategy.all_reduce_options.transport)
    print("WEIGHTS " + json.dumps([w.tolist() for w in model.get_weights()]))
    """
)


def data(num_samples):
    rng = np.random.default_rng(0)
    return rng.normal(size=(num_samples, 6)), rng.integers(0, 3, num_samples)


def build():
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
    return model


def one_device(num_samples):
    """(initial weights, weights after 2 epochs) on one device, in float64."""
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        x, y = data(num_samples)
        keras.utils.set_random_seed(0)
        with tf.distribute.get_strategy().scope():
            model = build()
        initial = model.get_weights()
        model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
        return initial, model.get_weights()
    finally:
        keras.config.set_floatx("float32")
        keras.config.set_dtype_policy("float32")


def train_on_workers(
    options,
    num_workers,
    initial,
    num_samples,
    timeout,
    *,
    transport=None,
    cannot_listen=(),
    run_eagerly=False,
):
    """Each worker's weights after the same `fit` under `options`.

    Args:
        transport: If given, the transport every worker must report using.
        cannot_listen: Worker indices made unable to open the socket ring.
        run_eagerly: Compile with `run_eagerly=True` (no `tf.function` step).
    """
    command = [
        sys.executable,
        "-c",
        _SCRIPT,
        json.dumps(options),
        json.dumps([w.tolist() for w in initial]),
        str(num_samples),
        ",".join(str(i) for i in cannot_listen) or "-",
        "eager" if run_eagerly else "graph",
    ]
    result = run_workers(command, num_workers, timeout=timeout, echo=False)
    assert result.ok, "\n".join(w.output[-2000:] for w in result.workers)
    weights = []
    for worker in result.workers:
        if transport is not None:
            assert f"TRANSPORT {transport}\n" in worker.output, worker.output[-2000:]
        line = next(
            ln for ln in worker.output.splitlines() if ln.startswith("WEIGHTS ")
        )
        weights.append([np.asarray(w) for w in json.loads(line[len("WEIGHTS ") :])])
    for other in weights[1:]:
        for a, b in zip(weights[0], other):
            np.testing.assert_array_equal(a, b)  # workers agree bit for bit
    return weights
