"""The one gradient all-reduce of our strategies: a sample-weighted mean.

Every replica multiplies its gradients by its sample count ``n_r`` (or its loss was
already multiplied, see `_sample_count.scale_loss_by_sample_count`) and the counts
travel in the same all-reduce, so one fused collective yields
``sum_r(n_r * g_r) / sum_r(n_r)``: the gradient of the mean loss over the global batch,
whatever the split (an uneven last batch, a replica with no samples). When no count was
declared (a custom loop calling ``strategy.run`` directly) every replica weighs 1 and
the result is the plain mean, which is what a per-replica mean loss needs.
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator.strategies import _sample_count


def all_reduce_mean(grads_and_vars):
    """Sample-weighted mean of gradients across replicas; `None` gradients pass."""
    grads_and_vars = list(grads_and_vars)
    context = tf.distribute.get_replica_context()
    if context is None:
        return grads_and_vars
    present = [i for i, (g, _) in enumerate(grads_and_vars) if g is not None]
    if not present:
        return grads_and_vars
    count = _sample_count.current_sample_count()
    weight = tf.constant(1.0) if count is None else tf.cast(count, tf.float32)
    if _sample_count.take_scaled_loss():
        weighted = {i: grads_and_vars[i][0] for i in present}
    else:
        weighted = {i: _scale(grads_and_vars[i][0], weight) for i in present}
    # One all-reduce per gradient dtype (TF packs a list into one buffer, which needs
    # a single dtype); the count rides with float32 or float64 gradients, where it
    # stays exact, or goes alone.
    groups: dict = {}
    for i in present:
        groups.setdefault(_dtype(weighted[i]), []).append(i)
    carrier = next((d for d in (tf.float32, tf.float64) if d in groups), None)
    total = None
    summed = {}
    for dtype, indices in groups.items():
        values = [weighted[i] for i in indices]
        if dtype == carrier:
            values.append(tf.cast(weight, dtype))
        reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, values)
        if dtype == carrier:
            total = reduced.pop()
        summed.update(zip(indices, reduced))
    if total is None:
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, weight)
    result = list(grads_and_vars)
    for i in present:
        result[i] = (_divide(summed[i], total), grads_and_vars[i][1])
    return result


def _divide(grad, total):
    # Divide in the gradient's own precision: a float32 reciprocal of the count
    # (1/300 is inexact) would cap float64 models at float32 accuracy.
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            grad.values / tf.cast(total, grad.values.dtype),
            grad.indices,
            grad.dense_shape,
        )
    return grad / tf.cast(total, grad.dtype)


def _dtype(grad):
    return grad.values.dtype if isinstance(grad, tf.IndexedSlices) else grad.dtype


def _scale(grad, factor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            grad.values * tf.cast(factor, grad.values.dtype),
            grad.indices,
            grad.dense_shape,
        )
    return grad * tf.cast(factor, grad.dtype)
