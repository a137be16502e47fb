"""Gradient buckets: fusing many small tensors into a few flat buffers.

One collective per tensor pays a fixed latency hundreds of times a step (214
calls for a ResNet-50 are 2.6-2.8x slower than the best packing, see
benchmarks/allreduce.py); one buffer for everything (TensorFlow's default) can
only start when the last gradient exists, and its transport moves one huge
message. Buckets of a few megabytes sit between the two.

Buckets are filled in *reverse* list order: Keras lists gradients in layer order
and the backward pass produces the last layer's gradients first, so the first
bucket is ready first. Each bucket is one flat tensor whose collective depends
only on its own gradients, so TensorFlow's dataflow executor can start it while
earlier layers are still being differentiated.
"""

from __future__ import annotations

import tensorflow as tf


def plan(sizes_in_bytes, bucket_bytes: float) -> list[list[int]]:
    """Groups indices into buckets of at most `bucket_bytes`, last index first.

    A tensor larger than a bucket, or of unknown size (`None`), gets a bucket of
    its own. `bucket_bytes <= 0` puts everything in one bucket.

    Args:
        sizes_in_bytes: Byte size of each tensor (`None`: unknown), in list order.
        bucket_bytes: Bucket capacity.

    Returns:
        Lists of indices; the first bucket holds the last tensors.

    Example:
    >>> plan([4, 4, 4, 8], 8)
    [[3], [2, 1], [0]]
    >>> plan([4, None, 4], 8)
    [[2], [1], [0]]
    """
    order = list(range(len(sizes_in_bytes)))[::-1]
    if bucket_bytes <= 0:
        return [order] if order else []
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i in order:
        size = sizes_in_bytes[i]
        if current and (size is None or filled + size > bucket_bytes):
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        if size is None:  # a bucket of its own
            buckets.append(current)
            current = []
        else:
            filled += size
    if current:
        buckets.append(current)
    return buckets


def flatten(tensors) -> tf.Tensor:
    """Concatenates `tensors` (one dtype) into one 1-D tensor."""
    if len(tensors) == 1:
        return tf.reshape(tensors[0], [-1])
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def unflatten(flat, like) -> list[tf.Tensor]:
    """Splits `flat` back into tensors shaped as `like`."""
    if len(like) == 1:
        return [_restore_shape(tf.reshape(flat, tf.shape(like[0])), like[0])]
    sizes = [t.shape.num_elements() for t in like]
    if any(s is None for s in sizes):  # known when the step runs
        sizes = tf.stack([tf.size(t) for t in like])
    parts = tf.split(flat, sizes, num=len(like))
    return [_restore_shape(tf.reshape(p, tf.shape(t)), t) for p, t in zip(parts, like)]


def num_bytes(tensor) -> int | None:
    """Bytes of a dense tensor; `None` if its static shape is not fully known.

    The library's gradients have their variables' static shapes
    (`_gradient_form.shaped_like`); other callers' tensors may not.
    """
    count = tensor.shape.num_elements()
    return None if count is None else count * tensor.dtype.size


def _restore_shape(tensor, like):
    tensor.set_shape(like.shape)
    return tensor


# Buckets of these dtypes carry the exact float32 scalars (sample counts); a
# 16-bit bucket would round counts above 2048.
EXACT_CARRIERS = (tf.float32, tf.float64)


def plan_by_dtype(tensors, bucket_bytes: float) -> list[list[int]]:
    """Buckets of same-dtype indices of `tensors`, float32 / float64 first.

    Within a dtype, `plan`'s reverse order; the first bucket of an
    `EXACT_CARRIERS` dtype, if any, is the first bucket returned, so it can carry
    the exact scalars. Used by the all-reduce and by the sharded update alike.

    Example:
    >>> import tensorflow as tf
    >>> plan_by_dtype([tf.zeros(2, tf.float16), tf.zeros(2), tf.zeros(2)], 16)
    [[2, 1], [0]]
    """
    groups: dict = {}
    for i, tensor in enumerate(tensors):
        groups.setdefault(tensor.dtype, []).append(i)
    buckets = []
    for dtype in sorted(groups, key=lambda d: d not in EXACT_CARRIERS):
        indices = groups[dtype]
        sizes = [num_bytes(tensors[i]) for i in indices]
        for bucket in plan(sizes, bucket_bytes):
            buckets.append([indices[j] for j in bucket])
    return buckets
