"""`InputWait`: the share of training time spent waiting for input, and a warning.

Why the dataset must be watched. Keras 3's TensorFlow trainer pulls each batch
*inside* the compiled train function (`next(iterator)` is a graph op), so nothing
a callback sees from Python separates waiting for input from computing: the time
between `on_train_batch_begin` and `on_train_batch_end` holds both, and the time
between batches holds neither. A timing `tf.py_function` in the pipeline would
itself take the GIL and serialize the pipeline it measures. So `watch(dataset)`
appends two graph-only stages to the end of the pipeline:

    zip(request_time, dataset).map(record)

`zip` pulls its inputs in order: first a stream whose every element is
`tf.timestamp()` -- the moment the consumer asked for the next element -- then the
dataset itself, which blocks until a batch is ready. The sequential `record` map
adds `tf.timestamp() - request_time` to a host variable and passes the element on
unchanged. No Python runs per batch and the element structure is unchanged.

The callback reads the accumulated wait every `every_n_steps` batches and logs
`input_wait_share` = waited seconds / wall seconds of those batches (capped at 1).

Limits:
- The consumer is whatever pulls from the end of the dataset. With plain `fit`
  that is the train step, so the share is exactly the step's input wait. Under
  tf.distribute strategies that prefetch to devices, the puller is the strategy's
  prefetcher, which asks again as soon as it has room: a pipeline that keeps up
  still shows about zero, but one that does not shows a share near 1 even when
  the replicas wait only part of each step. Read it as "the pipeline cannot keep
  up", not as a precise fraction; compare `kr.data.measure_pipeline` with the
  step rate for the margin.
- One worker's pipeline per process: on several workers each reports its own.
- Watch the training dataset only; a watched dataset iterated elsewhere (say
  for validation) adds that wait too.
"""

from __future__ import annotations

import time
import warnings

import keras
import tensorflow as tf

from keras_replicator._arguments import check_int


class InputWait(keras.callbacks.Callback):
    """Logs the share of training time spent waiting for input; warns when high.

    Wrap the training dataset with `watch` before `fit` (see the module docstring
    for how the wait is measured and its limits). Every `every_n_steps` batches
    the batch logs get `input_wait_share`; the epoch logs get the epoch's share.
    When a share exceeds `threshold` the callback warns once per `fit`, and
    `input_bound` becomes `True`.

    Args:
        threshold: Share of time waiting for input above which training is called
            input-bound. Defaults to `0.2`.
        every_n_steps: Measure every this many batches. Defaults to `20`.
        warmup_steps: Batches at the start of `fit` left out (tracing, first
            file reads, cache fill). Defaults to `2`.

    Example:
    >>> import keras, numpy as np, tensorflow as tf
    >>> import keras_replicator as kr
    >>> wait = kr.callbacks.InputWait(every_n_steps=5)
    >>> data = tf.data.Dataset.from_tensor_slices(
    ...     (np.zeros([64, 4], "float32"), np.zeros([64], "int32"))).batch(8)
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> model.compile("sgd", "sparse_categorical_crossentropy")
    >>> history = model.fit(wait.watch(data), epochs=2, verbose=0, callbacks=[wait])
    >>> 0.0 <= history.history["input_wait_share"][-1] <= 1.0
    True
    """

    def __init__(
        self, threshold: float = 0.2, every_n_steps: int = 20, warmup_steps: int = 2
    ):
        super().__init__()
        if not 0 < threshold < 1:
            raise ValueError(
                "`threshold` must be a share strictly between 0 and 1. "
                f"Received: threshold={threshold!r}."
            )
        check_int("every_n_steps", every_n_steps)
        check_int("warmup_steps", warmup_steps, minimum=0)
        self.threshold = threshold
        self.every_n_steps = every_n_steps
        self.warmup_steps = warmup_steps
        self.input_bound = False
        self.shares: list[float] = []
        self._waited = None

    def watch(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """Returns `dataset` with its consumer's wait recorded for this callback.

        Call outside `strategy.scope()`, on the training dataset, before `fit`.

        Args:
            dataset: A `tf.data.Dataset` (batched, as passed to `fit`).

        Returns:
            A dataset with the same elements.
        """
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(
                "`dataset` must be a `tf.data.Dataset`. Received: "
                f"dataset={type(dataset).__name__}. Wrap arrays with "
                "`tf.data.Dataset.from_tensor_slices(...).batch(...)` first."
            )
        if tf.distribute.has_strategy():
            raise RuntimeError(
                "`InputWait.watch` must be called outside `strategy.scope()`: its "
                "counter lives on this host, not on the replicas. Received: a call "
                f"under {type(tf.distribute.get_strategy()).__name__}. Build the "
                "dataset before entering the scope."
            )
        if self._waited is None:
            with tf.device("/cpu:0"):
                self._waited = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        waited = self._waited

        requests = tf.data.Dataset.from_tensors(0).repeat()
        requests = requests.map(lambda _: tf.timestamp())

        def record(requested, element):
            update = waited.assign_add(tf.timestamp() - requested)
            with tf.control_dependencies([update]):
                return tf.nest.map_structure(tf.identity, element)

        return tf.data.Dataset.zip((requests, dataset)).map(record)

    def on_train_begin(self, logs=None):
        if self._waited is None:
            raise ValueError(
                "`InputWait` has no dataset to measure. Received: no call to "
                "`watch`. Pass `callback.watch(train_dataset)` to `fit`."
            )
        self.input_bound = False
        self._steps = 0
        self._window = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = None

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self._steps < self.warmup_steps:
            return
        mark = (time.perf_counter(), float(self._waited.numpy()))
        if self._window is None or self._epoch is None:
            self._window = self._window or mark
            self._epoch = self._epoch or mark
            return
        if (self._steps - self.warmup_steps) % self.every_n_steps == 0:
            share = self._share(self._window, mark)
            self._window = mark
            if logs is not None:
                logs["input_wait_share"] = share
            self._check(share)

    def on_epoch_end(self, epoch, logs=None):
        if self._epoch is None:
            return
        now = (time.perf_counter(), float(self._waited.numpy()))
        share = self._share(self._epoch, now)
        self.shares.append(share)
        if logs is not None:
            logs["input_wait_share"] = share
        self._check(share)

    @staticmethod
    def _share(start, end) -> float:
        seconds = end[0] - start[0]
        return (
            float(min(1.0, max(0.0, (end[1] - start[1]) / seconds))) if seconds else 0.0
        )

    def _check(self, share):
        if share > self.threshold and not self.input_bound:
            self.input_bound = True
            warnings.warn(
                f"Training is input-bound: {100 * share:.0f}% of the time went to "
                f"waiting for the next batch (threshold {100 * self.threshold:.0f}%"
                "). Speed up the pipeline: parallel reads and maps, cache, "
                "prefetch, fused decode-and-crop (`kr.data.image_pipeline`), or "
                "more input hosts; `kr.data.measure_pipeline` shows its rate.",
                stacklevel=2,
            )

    def get_config(self):
        return {
            "threshold": self.threshold,
            "every_n_steps": self.every_n_steps,
            "warmup_steps": self.warmup_steps,
        }
