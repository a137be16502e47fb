"""Step logs on two real workers: averaged over the socket ring, one device's numbers.

On the ring (the default transport between CPU workers) the float logs of a step
are averaged with one ring call chained after the gradient buckets, not a gRPC
collective at the tail of every step (issue 36); the counts per step below are
read from the worker's `SocketRing`.
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

SAMPLES, BATCH = 256, 64  # 4 steps; 32 rows per worker and step

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras, numpy as np, tensorflow as tf
    import keras_replicator as kr
    from keras_replicator.communication import _strategy_transport
    from keras_replicator.keras_integration import _steps
    from tests.keras_integration.test_worker_logs import (
        BATCH, Recorder, build, data, mixed_logs,
    )

    strategy = kr.MultiWorkerReplicator(collective_timeout=60)
    ring = _strategy_transport.ring_of(strategy)
    worker = int(os.environ["KERAS_REPLICATOR_WORKER_INDEX"])
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    x, y = data()
    with strategy.scope():
        model = build()
    model.set_weights([np.asarray(w) for w in json.loads(sys.argv[1])])
    recorder = Recorder(lambda: ring.calls)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[recorder])
    returned = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True,
                              callbacks=[recorder])

    # The ring's mean against TensorFlow's MEAN all-reduce (the collectives'
    # path), on the same per-worker values: the bits of every float dtype.
    @tf.function
    def both_means():
        def replica():
            logs = mixed_logs(worker)
            context = tf.distribute.get_replica_context()
            mean = lambda v: context.all_reduce(tf.distribute.ReduceOp.MEAN, v)
            collective = {k: mean(v) for k, v in logs.items() if k != "count"}
            return _steps._mean_over_workers(logs), collective
        return strategy.run(replica)

    mine, collective = both_means()
    print("RESULT " + json.dumps({
        "transport": strategy.all_reduce_options.transport,
        "train": recorder.train, "test": recorder.test, "returned": returned,
        "dtypes": {k: v.dtype.name for k, v in mine.items()},
        "mine": {k: v.numpy().tobytes().hex() for k, v in mine.items()},
        "collective": {k: v.numpy().tobytes().hex() for k, v in collective.items()},
    }), flush=True)
    """
)


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(SAMPLES, 6)), rng.integers(0, 3, SAMPLES)


def build():
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        keras.optimizers.SGD(0.1),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[
            "accuracy",
            # A float32 log among the float64 ones: one call carries both.
            keras.metrics.SparseCategoricalCrossentropy(
                name="xent32", from_logits=True, dtype="float32"
            ),
        ],
    )
    return model


def mixed_logs(worker):
    """Per-worker logs of every float dtype, vectors to exercise the rounding."""
    rng = np.random.default_rng(worker)
    logs = {
        dtype: tf.constant(rng.normal(scale=100.0, size=1000), dtype)
        for dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64)
    }
    logs = {dtype.name: value for dtype, value in logs.items()}
    logs["scalar"] = tf.constant(float(worker) / 3.0, tf.float32)
    logs["count"] = tf.constant(worker, tf.int64)  # not averaged: this worker's
    return logs


class Recorder(keras.callbacks.Callback):
    """Each batch's logs and the worker's ring call count after it."""

    def __init__(self, calls=lambda: 0):
        super().__init__()
        self._calls = calls
        self.train, self.test = [], []

    def _record(self, into, logs):
        into.append([self._calls(), {k: float(v) for k, v in logs.items()}])

    def on_train_batch_end(self, batch, logs=None):
        self._record(self.train, logs)

    def on_test_batch_end(self, batch, logs=None):
        self._record(self.test, logs)


def _one_device(initial):
    recorder = Recorder()
    model = build()
    model.set_weights(initial)
    model.fit(
        *data(),
        batch_size=BATCH,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[recorder],
    )
    returned = model.evaluate(
        *data(), batch_size=BATCH, verbose=0, return_dict=True, callbacks=[recorder]
    )
    return recorder, returned


@pytest.mark.timeout(240)
def test_two_workers_average_logs_over_the_ring_like_one_device(float64):
    keras.utils.set_random_seed(0)
    with tf.distribute.get_strategy().scope():
        initial = build().get_weights()
    single, single_returned = _one_device(initial)
    command = [
        sys.executable,
        "-c",
        _SCRIPT,
        json.dumps([w.tolist() for w in initial]),
    ]
    result = run_workers(command, 2, timeout=200, echo=False)
    assert result.ok, result.describe_failure()
    reports = []
    for worker in result.workers:
        line = next(x for x in worker.output.splitlines() if x.startswith("RESULT "))
        reports.append(json.loads(line[len("RESULT ") :]))
    for worker, report in enumerate(reports):
        assert report["transport"] == "socket"
        for phase, expected in (("train", single.train), ("test", single.test)):
            for (_, logs), (_, one) in zip(report[phase], expected, strict=True):
                assert logs.keys() == one.keys()
                for key, value in one.items():
                    rtol = 1e-6 if key == "xent32" else 1e-12
                    np.testing.assert_allclose(logs[key], value, rtol=rtol)
        for key, value in single_returned.items():
            rtol = 1e-6 if key == "xent32" else 1e-12
            np.testing.assert_allclose(report["returned"][key], value, rtol=rtol)
        # The ring's mean has the collective's bits and keeps each dtype.
        count = report["mine"].pop("count")
        assert report["mine"] == report["collective"]
        assert report["dtypes"]["float16"] == "float16"
        assert report["dtypes"]["float64"] == "float64"
        assert report["dtypes"]["count"] == "int64"  # this worker's own
        assert count == np.int64(worker).tobytes().hex()
        # Ring calls per step (steady state, after the first): a test step's
        # only call is its logs' mean (before issue 36: none, a gRPC collective).
        calls = [c for c, _ in report["test"]]
        assert np.diff(calls).tolist() == [1] * (len(calls) - 1), calls
        # A train step: the one gradient bucket carries the sample count, then
        # the logs' mean (before: the count alone, the bucket, a gRPC collective).
        calls = [c for c, _ in report["train"]]
        assert np.diff(calls).tolist() == [2] * (len(calls) - 1), calls
    # Every worker logs the same bits.
    assert reports[0]["train"] == reports[1]["train"]
    assert reports[0]["test"] == reports[1]["test"]
    assert reports[0]["mine"] == reports[1]["mine"]
