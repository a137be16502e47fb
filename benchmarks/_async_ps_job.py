"""One arm of the async-vs-sync benchmark, in the process(es) the parent started.

The digits job, its input pipeline (the straggler's sleep and the per-batch
stamps: TensorFlow ops, so the one graph the chief traces decides at run time on
each worker whether that worker sleeps) and the `fit` that prints one RESULT line.
"""

from __future__ import annotations

import os
import time

from benchmarks import harness
from benchmarks._async_ps_stats import (
    BATCH,
    EPOCH_EXAMPLES,
    RESULT,
    STRAGGLER,
    SYNC_STEPS,
    TRAIN,
    WORKERS,
    steady_epoch_seconds,
)

# The task of this process as TF_CONFIG names it ("worker 1"), read at run time.
_TASK_PATTERN = r'(?s).*"type": "(\w+)", "index": (\d+).*'


def digits():
    import numpy as np
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16).astype("float32")
    y = data.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:TRAIN], y[:TRAIN], x[TRAIN:], y[TRAIN:]


def task_of(environ):
    """The task TF_CONFIG names in a process environment ("worker 1"), else "local".

    `environ` is a string tensor such as the contents of `/proc/self/environ`:
    read at run time, so the one traced graph tells the workers apart.
    """
    import tensorflow as tf

    found = tf.strings.regex_full_match(environ, _TASK_PATTERN)
    task = tf.strings.regex_replace(environ, _TASK_PATTERN, r"\1 \2")
    return tf.where(found, task, "local")


def _sleep_each(dataset, microseconds):
    import tensorflow as tf

    specs = tf.nest.flatten(dataset.element_spec)
    variant = tf.raw_ops.SleepDataset(
        input_dataset=tf.data.experimental.to_variant(dataset),
        sleep_microseconds=tf.cast(microseconds, tf.int64),
        output_types=[s.dtype for s in specs],
        output_shapes=[s.shape for s in specs],
    )
    return tf.data.experimental.from_variant(variant, dataset.element_spec)


def pipeline(x, y, *, sleep_us: int, stamp_file: str, shard=None):
    """Shuffled, repeated batches of 32; the straggler sleeps before each batch."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if shard is not None:
        dataset = dataset.shard(*shard)
    dataset = dataset.shuffle(len(x)).repeat().batch(BATCH, drop_remainder=True)
    task = task_of(tf.io.read_file("/proc/self/environ"))
    if sleep_us:
        dataset = _sleep_each(dataset, tf.where(task == STRAGGLER, sleep_us, 0))
    if stamp_file:

        def stamp(features, labels):
            now = tf.cast(tf.timestamp() * 1e6, tf.int64)
            printed = tf.print(task, now, output_stream=f"file://{stamp_file}")
            with tf.control_dependencies([printed]):
                return tf.identity(features), tf.identity(labels)

        dataset = dataset.map(stamp)
    # One batch in flight: a worker's pipeline runs beside its step, so the
    # straggler's batch interval is its sleep, the same in both arms.
    return dataset.prefetch(1)


def build(learning_rate: float):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def job(mode: str, epochs: int, sleep_us: int, stamp_file: str, lr: float) -> None:
    """One arm, in the process(es) the parent started; prints one RESULT line."""
    import keras
    import tensorflow as tf

    import keras_replicator as kr

    if mode == "async":
        strategy = kr.ParameterServerReplicator()  # worker / ps tasks block here
    elif mode == "sync":
        strategy = kr.MultiWorkerReplicator(collective_timeout=120)
    else:
        strategy = tf.distribute.get_strategy()
    x, y, x_test, y_test = digits()
    ends: list[float] = []

    class EpochEnds(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            ends.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            ends.append(time.perf_counter())

    options = dict(sleep_us=sleep_us, stamp_file=stamp_file)
    if mode == "sync":
        # Learning rates: docs/async.md. Sync averages 2 batches of 32 (global 64):
        # the linear scaling rule doubles the one-device rate.
        with strategy.scope():
            model = build(kr.scaled_learning_rate(lr, BATCH * WORKERS, BATCH))

        def input_fn(context):
            shard = (context.num_input_pipelines, context.input_pipeline_id)
            return pipeline(x, y, shard=shard, **options)

        data = strategy.distribute_datasets_from_function(input_fn)
        steps = SYNC_STEPS
    elif mode == "async":
        # Each update is one worker's batch, about W - 1 updates stale: lr / W.
        with strategy.scope():
            model = build(lr / strategy.num_workers)
        data = lambda: pipeline(x, y, **options)  # noqa: E731 (a dataset function)
        steps = SYNC_STEPS * WORKERS
    else:
        model = build(lr)
        data = pipeline(x, y, **options)
        steps = SYNC_STEPS * WORKERS
    model.fit(
        data, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=[EpochEnds()]
    )
    _, accuracy = model.evaluate(x_test, y_test, batch_size=128, verbose=0)
    epoch = steady_epoch_seconds(ends)
    result = {
        "mode": mode,
        "epoch_seconds": epoch,
        "examples_per_s": EPOCH_EXAMPLES / epoch,
        "updates_per_s": steps / epoch,
        "first_epoch_seconds": ends[1] - ends[0],
        "accuracy": float(accuracy),
    }
    if mode != "sync" or os.environ.get("KERAS_REPLICATOR_WORKER_INDEX") == "0":
        harness.emit_result(result, RESULT)
