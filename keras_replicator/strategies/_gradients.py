"""The one gradient all-reduce of our strategies: a sample-weighted mean.

Every replica multiplies its gradients by its sample count ``n_r`` and the counts
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
    weighted = [_scale(grads_and_vars[i][0], weight) for i in present]
    reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, weighted + [weight])
    total = reduced[-1]
    result = list(grads_and_vars)
    for i, grad in zip(present, reduced[:-1]):
        result[i] = (_scale(grad, 1.0 / total), grads_and_vars[i][1])
    return result


def _scale(grad, factor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            grad.values * tf.cast(factor, grad.values.dtype),
            grad.indices,
            grad.dense_shape,
        )
    return grad * tf.cast(factor, grad.dtype)
