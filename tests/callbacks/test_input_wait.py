"""`InputWait` flags a pipeline slowed by a sleep, not a fast cached one (fast)."""

import time
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.callbacks import InputWait

BATCH = 16


def _dataset(sleep_seconds):
    x = np.random.default_rng(0).random((256, 32), dtype=np.float32)
    y = (x[:, 0] > 0.5).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).cache().repeat()
    dataset = dataset.batch(BATCH, drop_remainder=True)
    if sleep_seconds:

        def slow(images):
            time.sleep(sleep_seconds)
            return images

        def sleepy(images, labels):
            images = tf.py_function(slow, [images], tf.float32)
            return tf.ensure_shape(images, [BATCH, 32]), labels

        dataset = dataset.map(sleepy)
    return dataset.prefetch(2)


class _EpochTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.begins, self.ends = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.begins.append(time.perf_counter())

    def on_epoch_end(self, epoch, logs=None):
        self.ends.append(time.perf_counter())


def _fit(callback, dataset, strategy=None, timer=None):
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((32,)),
                # Wide enough that a step (a few ms) dwarfs a cached batch's
                # delivery: with 256 units the two were close, and one window
                # in a loaded run crossed the threshold.
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(2),
            ]
        )
        model.compile(
            keras.optimizers.SGD(0.01),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(
            dataset,
            steps_per_epoch=24,
            epochs=2,
            verbose=0,
            callbacks=[callback] + ([timer] if timer else []),
        )
    messages = [str(w.message) for w in caught if "input-bound" in str(w.message)]
    return history.history["input_wait_share"], messages


@pytest.mark.parametrize(
    "replicas",
    [
        1,
        pytest.param(
            2,
            marks=pytest.mark.slow(
                reason="covered in the default run by: the same test [1]"
            ),
        ),
    ],
)
def test_slowed_pipeline_is_input_bound_and_a_cached_one_is_not(replicas):
    strategy = kr.MultiDeviceReplicator(num_replicas=2) if replicas == 2 else None
    fast = InputWait(threshold=0.3, every_n_steps=8)
    timer = _EpochTimes()
    shares, messages = _fit(fast, fast.watch(_dataset(0)), strategy, timer)
    step = (timer.ends[1] - timer.begins[1]) / 24  # the second epoch: traced
    assert max(shares) < 0.3 and not fast.input_bound and not messages
    assert fast.shares == shares
    # The slowed pipeline sleeps several steps a batch, on any machine: a fixed
    # 30 ms was less than one step on a slow day, and prefetching kept up.
    slow = InputWait(threshold=0.3, every_n_steps=8)
    delay = max(0.03, 5 * step)
    shares, messages = _fit(slow, slow.watch(_dataset(delay)), strategy)
    assert min(shares) > 0.6 and slow.input_bound and len(messages) == 1, (
        shares,
        delay,
    )
    assert "Training is input-bound" in messages[0]


def test_watch_keeps_the_elements():
    dataset = tf.data.Dataset.range(6).map(lambda i: (i, 2 * i)).batch(4)
    watched = InputWait().watch(dataset)
    assert watched.element_spec == dataset.element_spec
    got = [(a.numpy().tolist(), b.numpy().tolist()) for a, b in watched]
    assert got == [([0, 1, 2, 3], [0, 2, 4, 6]), ([4, 5], [8, 10])]


def test_misuse_is_a_clear_error():
    with pytest.raises(ValueError, match="threshold"):
        InputWait(threshold=1.5)
    with pytest.raises(ValueError, match="every_n_steps"):
        InputWait(every_n_steps=0)
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        InputWait().watch(np.zeros(3))
    with kr.MultiDeviceReplicator(num_replicas=2).scope():
        with pytest.raises(RuntimeError, match="outside `strategy.scope"):
            InputWait().watch(tf.data.Dataset.range(3))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="watch"):
        model.fit(np.zeros([4, 2]), np.zeros([4]), verbose=0, callbacks=[InputWait()])
