"""`observe_loss`: how a training step hands the loss to optimizers that use it.

Keras optimizers never see the loss, but NLCG's step control needs it. Rather than
teach every training loop about NLCG, loops call `observe_loss(optimizer, loss)` once
per step before `apply_gradients`: a no-op for optimizers without a `uses_loss`
property that is true (every Keras optimizer), unwrapping `LossScaleOptimizer`.

The loss must be the **global-batch mean** (the same value on every replica): pass
`sample_count` to let `observe_loss` form it from per-replica means in one
all-reduce (`sum_r(n_r * loss_r) / sum_r(n_r)`, exact for uneven splits). The
all-reduce runs only when the optimizer uses the loss, and then on every replica,
so the collective is always matched.

`fit` needs no call: Keras' `train_step` asks the optimizer to scale the loss it
differentiates (`optimizer.scale_loss`, inside the tape, before
`apply_gradients`), and an optimizer that uses the loss records it there
(`observe_scaled_loss`: the global-batch mean from each replica's mean), on one
device and under every strategy, with nothing installed. Custom loops, `run_steps`
and a `train_step` that does not call `scale_loss` call `observe_loss` in their
step.
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator import _compat
from keras_replicator.keras_integration import _sample_count


def uses_loss(optimizer) -> bool:
    """Whether `optimizer` (or the optimizer it wraps) needs `observe_loss` calls."""
    return bool(getattr(_innermost(optimizer), "uses_loss", False))


def observe_loss(optimizer, loss, sample_count=None) -> None:
    """Hands `loss` to `optimizer` if it uses the loss; otherwise does nothing.

    Call it once per training step, before `apply_gradients`, in the replica
    context (inside `strategy.run` or a Keras `train_step`) or on one device.

    Args:
        optimizer: Any Keras optimizer (a `LossScaleOptimizer` is unwrapped).
        loss: A scalar tensor: the global-batch mean loss, or, with
            `sample_count`, this replica's mean loss over its own samples.
            Pass the unscaled loss (before `optimizer.scale_loss`).
        sample_count: This replica's number of samples (a scalar), or `None` if
            `loss` already is the global-batch mean. Defaults to `None`.

    Example:
    >>> import keras, numpy as np
    >>> from keras_replicator.optimizers import NLCG, observe_loss
    >>> variable = keras.Variable(np.ones(2))
    >>> optimizer = NLCG(0.1)
    >>> observe_loss(optimizer, keras.ops.sum(variable**2))
    >>> optimizer.apply([2 * variable.value], [variable])
    >>> observe_loss(keras.optimizers.SGD(0.1), 1.0)  # no-op for other optimizers
    """
    inner = _innermost(optimizer)
    if not getattr(inner, "uses_loss", False):
        return
    if sample_count is not None:
        loss = global_mean(loss, sample_count)
    inner.set_loss(loss)


def global_mean(loss, sample_count):
    """The sample-weighted mean of per-replica mean losses over all replicas."""
    loss = tf.convert_to_tensor(loss)
    dtype = loss.dtype if loss.dtype.is_floating else tf.float32
    loss = tf.cast(loss, dtype)
    count = tf.cast(sample_count, dtype)
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return loss
    total, samples = context.all_reduce(
        tf.distribute.ReduceOp.SUM, [loss * count, count]
    )
    return tf.where(samples > 0, total / tf.maximum(samples, 1), loss)


def observe_scaled_loss(optimizer, loss) -> None:
    """`observe_loss` for the loss a train step asks `optimizer` to scale.

    That loss is this replica's mean, divided by the replica count under stock
    strategies (undone here, as Keras' `train_step` undoes it for its loss
    tracker). Our steps declare the replica's sample count, which weighs the
    replicas' means exactly; elsewhere the replicas weigh equally, as stock Keras
    weighs their gradients (exact when they hold equal shares).
    """
    loss = tf.convert_to_tensor(_compat.replica_mean_loss(loss))
    declared = _sample_count.declared()
    count = tf.ones((), "float32")
    if declared is not None and not declared.equal_weights:
        count = declared.count
    observe_loss(optimizer, tf.stop_gradient(loss), sample_count=count)


def _innermost(optimizer):
    while hasattr(optimizer, "inner_optimizer"):
        optimizer = optimizer.inner_optimizer
    return optimizer
