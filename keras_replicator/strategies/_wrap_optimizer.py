"""`wrap_optimizer`: exact gradient averaging for hand-written replica steps.

TF-Replicator's `wrap_optimizer` let a step written with an ordinary per-replica
mean loss train like one device at the global batch. Under our strategies every
Keras optimizer already does that (its gradient all-reduce is our sample-weighted
mean, `_gradients`), so wrapping returns the optimizer unchanged. Under a stock
strategy, whose Keras optimizers *sum* replica gradients, the wrapper scales each
replica's gradients by its share of the global batch before the sum.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_replicator import _compat
from keras_replicator.strategies import _sample_count


def wrap_optimizer(optimizer):
    """Makes `optimizer` average gradients across replicas, weighted by samples.

    Args:
        optimizer: A `keras.optimizers.Optimizer`.

    Returns:
        `optimizer` itself under a Replicator strategy (it already averages), else a
        proxy whose `apply` / `apply_gradients` average before the stock sum.

    Example:
    >>> import keras, keras_replicator as kr
    >>> optimizer = kr.wrap_optimizer(keras.optimizers.SGD(0.1))
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "`optimizer` must be a `keras.optimizers.Optimizer`. Received: "
            f"optimizer={optimizer!r} of type {type(optimizer).__name__}."
        )
    if _compat.is_replicator(tf.distribute.get_strategy()):
        return optimizer
    return _AveragingOptimizer(optimizer)


class _AveragingOptimizer:
    """Forwards to a Keras optimizer; scales gradients by the replica's batch share."""

    def __init__(self, optimizer):
        self._kr_inner = optimizer

    def __getattr__(self, name):
        return getattr(self._kr_inner, name)

    def apply_gradients(self, grads_and_vars):
        grads, variables = zip(*grads_and_vars)
        return self.apply(list(grads), list(variables))

    def apply(self, grads, trainable_variables=None):
        return self._kr_inner.apply(_share_of_batch(grads), trainable_variables)


def _share_of_batch(grads):
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return grads
    count = _sample_count.current_sample_count()
    weight = tf.constant(1.0) if count is None else tf.cast(count, tf.float32)
    share = weight / context.all_reduce(tf.distribute.ReduceOp.SUM, weight)
    return [None if g is None else g * tf.cast(share, g.dtype) for g in grads]
