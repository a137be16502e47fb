"""Deferred batch norm: moving statistics from the whole mini-batch, once per step.

On one device, `BatchNormalization` in training normalizes each sample with the
statistics of the whole mini-batch and moves its moving mean and variance once per
step. Normalizing with whole-mini-batch statistics inside a pipeline would need every
micro-batch to reach the layer before any can leave it, which removes the pipeline.
So, as GPipe and torchgpipe do, a pipeline normalizes each micro-batch with its own
statistics (the "ghost batch norm" of Hoffer et al. 2017), and *defers* the moving
statistics: each micro-batch's count, mean and variance are kept and combined
exactly (Chan et al.'s parallel formula) into the mini-batch's mean and biased
variance, and the moving statistics move once per step with them, exactly as on one
device. Hence:

* with `num_microbatches=1`, training is identical to one device;
* with more micro-batches, the moving statistics (and so evaluation and inference)
  follow the whole mini-batch as on one device, and the training forward pass equals
  one device running each micro-batch's samples as a separate batch-norm group
  (tested in `tests/pipeline/test_batchnorm.py`).

This applies to the `BatchNormalization` layers of the chain being cut (not renorm).
Batch norm nested inside a composite layer (a residual block) keeps Keras'
behaviour per micro-batch: its moving statistics move once per micro-batch.
"""

from __future__ import annotations

import keras
import tensorflow as tf


def is_deferrable(layer) -> bool:
    return (
        type(layer) is keras.layers.BatchNormalization
        and not layer.renorm
        and layer.trainable
    )


def moments(layer, x):
    """`(count, mean, variance)` of `x` over the layer's reduction axes."""
    x = tf.cast(x, keras.backend.result_type(x.dtype, "float32"))
    rank = len(x.shape)
    axis = layer.axis % rank
    axes = [i for i in range(rank) if i != axis]
    mean, variance = keras.ops.moments(x, axes=axes)
    shape = tf.shape(x)
    count = tf.cast(tf.reduce_prod(tf.gather(shape, axes)), mean.dtype)
    return count, mean, variance


def combine(stats: list):
    """Combines per-micro-batch `(count, mean, variance)` into the mini-batch's.

    Example:
    >>> a = tf.constant([1.0, 2.0]); b = tf.constant([4.0, 8.0, 9.0])
    >>> n, m, v = combine([(2.0, tf.reduce_mean(a), tf.math.reduce_variance(a)),
    ...                    (3.0, tf.reduce_mean(b), tf.math.reduce_variance(b))])
    >>> round(float(m), 4), round(float(v), 4)
    (4.8, 10.16)
    """
    if len(stats) == 1:
        return stats[0]
    total = tf.add_n([n for n, _, _ in stats])
    mean = tf.add_n([n * m for n, m, _ in stats]) / total
    variance = tf.add_n([n * (v + tf.square(m - mean)) for n, m, v in stats]) / total
    return total, mean, variance


def update_moving_statistics(layer, stats: list) -> None:
    """Moves `layer`'s moving mean and variance once, with the combined `stats`."""
    _, mean, variance = combine(stats)
    momentum = layer.momentum
    moving_mean = tf.cast(layer.moving_mean.value, mean.dtype)
    moving_variance = tf.cast(layer.moving_variance.value, mean.dtype)
    layer.moving_mean.assign(moving_mean * momentum + mean * (1.0 - momentum))
    layer.moving_variance.assign(
        moving_variance * momentum + variance * (1.0 - momentum)
    )
