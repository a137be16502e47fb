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

`fit` calls it for you: creating an optimizer that uses the loss installs
`_observe_fit_loss` as the observer of Keras' training loss
(`_compat/loss_hook.py`), which forms the global-batch mean from each replica's
mean and sample count, on one device and under every strategy. Custom loops,
`run_steps` and a `train_step` that calls `compute_loss` itself call
`observe_loss` in their step.
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator import _compat


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


def install_fit_hook() -> None:
    """Makes `fit` hand its training loss to optimizers that use it (idempotent)."""
    _compat.loss_hook.install(_observe_fit_loss)


def _observe_fit_loss(model, x, loss) -> None:
    """`observe_loss` for the loss Keras' `train_step` computed, in its replica."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not uses_loss(optimizer):
        return
    loss = tf.convert_to_tensor(_compat.loss_hook.replica_mean_loss(loss))
    observe_loss(optimizer, tf.stop_gradient(loss), sample_count=_batch_size(x))


def _batch_size(x):
    """The number of samples in `x`, counted as Keras' `train_step` counts them."""
    first = _compat.loss_hook.first_input(x)
    if isinstance(first, tf.RaggedTensor):
        return first.nrows()
    if isinstance(first, tf.SparseTensor):
        return first.dense_shape[0]
    if first is None or tf.convert_to_tensor(first).shape.rank == 0:
        return tf.ones((), "int32")
    return tf.shape(first)[0]


def _innermost(optimizer):
    while hasattr(optimizer, "inner_optimizer"):
        optimizer = optimizer.inner_optimizer
    return optimizer
