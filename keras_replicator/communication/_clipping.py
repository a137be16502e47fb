"""Gradient clipping on the reduced gradient: what one device would clip.

Keras clips in `BaseOptimizer._backend_apply_gradients`, before the TensorFlow
optimizer's all-reduce, so under any multi-replica strategy `clipnorm`,
`global_clipnorm` and `clipvalue` act on each replica's own gradient. Under our
strategies that gradient carries the replica's sample count (the loss is scaled
by it before differentiation, `keras_integration/_sample_count`), so the
threshold was in effect divided by the per-replica batch: a clipped step 10-11x
smaller than one device's (issue 53; stock, which sums 1/N-scaled gradients, is
about 1.4x off the other way). Clipping is in nearly every Transformer recipe.

Under our strategies (and optimizers `kr.wrap_optimizer` marked), with several
replicas in sync, Keras' clipping is therefore a no-op in the replica step
(`defers`, asked by the `_compat/clipping.py` patch) and happens here instead,
on the reduced gradient every replica holds: `clip` after the all-reduce
(`_hooks.KerasHooks.all_reduce_gradients`, also the accumulation update and the
whole-list optimizers, which reduce there), `clip_pieces` after a sharded
update's reduce-scatter (`sharding/_update`), where a norm needs one small
all-reduce of the pieces' sums of squares.

The formulas are Keras' own (`BaseOptimizer._clip_by_norm`, `clip_by_global_norm`),
written out because Keras' take whole tensors and one dtype: the global norm is
summed in the widest gradient dtype, so float32 LoRA kernels in a float64 model
clip (Keras' own `clip_by_global_norm` raises on mixed dtypes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from keras_replicator import _compat
from keras_replicator._replicator_state import marked_averaging


def clips(optimizer) -> bool:
    """Whether `optimizer` has a Keras clipping option set."""
    return bool(
        (optimizer.clipnorm and optimizer.clipnorm > 0)
        or (optimizer.global_clipnorm and optimizer.global_clipnorm > 0)
        or (optimizer.clipvalue and optimizer.clipvalue > 0)
    )


def defers(optimizer) -> bool:
    """Whether `optimizer`'s clipping waits for the reduced gradient (see above).

    True in a replica context of several replicas in sync, under our strategies
    or for an optimizer `kr.wrap_optimizer` marked, when a clipping option is set.
    """
    if not clips(optimizer) or tf.distribute.get_replica_context() is None:
        return False
    if tf.distribute.get_strategy().num_replicas_in_sync == 1:
        return False
    return _compat.is_replicator_current() or marked_averaging(optimizer)


def clip(optimizer, gradients: Sequence) -> list:
    """Keras' clipping of `optimizer` applied to whole reduced `gradients`."""
    return clip_pieces(optimizer, gradients, sum_over_replicas=None)


def clip_pieces(
    optimizer,
    gradients: Sequence,
    sum_over_replicas: Callable[[tf.Tensor], tf.Tensor] | None,
) -> list:
    """Keras' clipping of `optimizer`, on gradients or on pieces of them.

    Args:
        optimizer: The Keras optimizer whose `clipnorm`, `global_clipnorm` or
            `clipvalue` applies.
        gradients: One gradient (or this replica's piece of one) per variable;
            `None` passes through.
        sum_over_replicas: For pieces: sums a float tensor over the replicas,
            so norms are those of the whole gradients. `None` for whole ones.

    Returns:
        The clipped gradients, in order.
    """
    present = [i for i, g in enumerate(gradients) if g is not None]
    result = list(gradients)
    # Keras' precedence: clipnorm, else global_clipnorm, else clipvalue.
    if not present or not clips(optimizer):
        return result
    if not _norm_clipping(optimizer):
        limit = optimizer.clipvalue
        for i in present:
            result[i] = _map_values(
                gradients[i],
                lambda v: keras.ops.clip(v, -limit, limit),  # Keras' own op
            )
        return result
    wide = _widest([gradients[i] for i in present])
    squares = tf.stack([_square_sum(gradients[i], wide) for i in present])
    if sum_over_replicas is not None:
        squares = tf.cast(sum_over_replicas(squares), wide)
    if optimizer.clipnorm and optimizer.clipnorm > 0:
        limit = tf.constant(optimizer.clipnorm, wide)
        for k, i in enumerate(present):
            l2sum = squares[k]
            positive = l2sum > 0
            safe = tf.where(positive, l2sum, tf.ones_like(l2sum))
            l2norm = tf.where(positive, tf.sqrt(safe), l2sum)
            factor = limit / tf.maximum(l2norm, limit)
            result[i] = _map_values(gradients[i], lambda v, f=factor: v * _as(f, v))
        return result
    limit = tf.constant(optimizer.global_clipnorm, wide)
    norm = tf.sqrt(tf.reduce_sum(squares))
    # Keras' formula: a non-finite norm makes the scale NaN.
    scale = limit * tf.minimum(1.0 / norm, 1.0 / limit) + (norm - norm)
    for i in present:
        result[i] = _map_values(gradients[i], lambda v: v * _as(scale, v))
    return result


def _norm_clipping(optimizer) -> bool:
    return bool(
        (optimizer.clipnorm and optimizer.clipnorm > 0)
        or (optimizer.global_clipnorm and optimizer.global_clipnorm > 0)
    )


def _widest(gradients) -> tf.DType:
    dtypes = {_values(g).dtype for g in gradients}
    return tf.float64 if tf.float64 in dtypes else tf.float32


def _square_sum(gradient, dtype) -> tf.Tensor:
    # A reduced IndexedSlices has each row once (`_gradient_form`): the norm of
    # its values is the dense gradient's.
    return tf.reduce_sum(tf.square(tf.cast(_values(gradient), dtype)))


def _values(gradient):
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _map_values(gradient, function):
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(
            function(gradient.values), gradient.indices, gradient.dense_shape
        )
    return function(gradient)


def _as(value, like):
    return tf.cast(value, like.dtype)
