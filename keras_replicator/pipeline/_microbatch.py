"""Micro-batches: a mini-batch split along its first axis, and joined back.

Any batch size works: when it is not divisible by the number of micro-batches the
first `batch % M` micro-batches get one sample more. The loss is computed once on the
joined outputs, so an uneven split changes nothing but the grouping of the work (and
the per-micro-batch batch-norm statistics, see `_batchnorm`).
"""

from __future__ import annotations

import tensorflow as tf


def split(x, num_microbatches: int) -> list:
    """Splits `x` (a tensor or a nest of tensors) into `num_microbatches` pieces.

    Example:
    >>> [int(p.shape[0]) for p in split(tf.zeros([5, 2]), 2)]
    [3, 2]
    """
    if num_microbatches == 1:
        return [x]
    flat = tf.nest.flatten(x)
    batch = tf.shape(flat[0])[0]
    base = batch // num_microbatches
    extra = batch % num_microbatches
    sizes = [base + tf.cast(i < extra, batch.dtype) for i in range(num_microbatches)]
    static = flat[0].shape[0]
    if static is not None:
        q, r = divmod(static, num_microbatches)
        sizes = [q + (1 if i < r else 0) for i in range(num_microbatches)]
    pieces = [tf.split(t, tf.stack(sizes) if static is None else sizes) for t in flat]
    return [
        tf.nest.pack_sequence_as(x, [p[i] for p in pieces])
        for i in range(num_microbatches)
    ]


def join(outputs: list):
    """Concatenates micro-batch outputs (tensors or nests) along the first axis.

    Example:
    >>> join([tf.zeros([3, 2]), tf.zeros([2, 2])]).shape
    TensorShape([5, 2])
    """
    if len(outputs) == 1:
        return outputs[0]
    return tf.nest.map_structure(lambda *ts: tf.concat(ts, axis=0), *outputs)
