"""The sharded update: reduce-scatter, update this replica's pieces, all-gather.

It does the work of Keras' TensorFlow `_backend_update_step` (the all-reduce,
then one `update_step` per variable) when the strategy shards the weight update:
it runs in that method's all-reduce (`_compat/optimizer.py`), which then hands
Keras no pairs left to update. Everything Keras does around it (weight decay,
loss-scale unscaling, gradient accumulation, EMA, the step counter) is
unchanged; Keras' clipping, deferred under our strategies, acts on the reduced
pieces here (`communication/_clipping`).
It asks `communication/` for four things only: the reduction rule (`_reduction`: this
replica's share of the sum, the sample-weighted mean's weights or the stock
sum), the bucket plan (`_buckets.plan_by_dtype`: the strategy's `bucket_mb`, in
reverse layer order, sized by `Transport.bucket_bytes` as for the all-reduce),
the transport (`_transport`) and the clipping (`_clipping`).
Per bucket of same-dtype gradients:

1. this replica's share is packed into the `[N, C]` piece matrix (`_layout`),
   the sample count riding in every row;
2. `_exchange.reduce_scatter` leaves row `r` of the sum on replica `r`;
3. for each variable, the replica's piece of the weights is loaded into its
   piece variable, and the optimizer's own `update_step` runs on it with the
   piece of the gradient and the one-piece slots (`_slots`); an optimizer that
   needs whole-variable norms (LARS, Lamb) runs its step in two halves around
   one small all-reduce of the pieces' sums of squares (`_norm_rules`);
4. the updated pieces are all-gathered and written into the whole variables
   (one `merge_call` for all of them, as Keras assigns per device).

Every replica ends with the same weights, bit for bit: each element is updated
by exactly one replica and copied to the others.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_replicator import _compat
from keras_replicator.communication import (
    _buckets,
    _clipping,
    _gradient_form,
    _reduction,
    _strategy_transport,
)
from keras_replicator.sharding import (
    _exchange,
    _layout,
    _norm_rules,
    _slots,
    _support,
)


def sharded_update_step(
    optimizer, grads, trainable_variables, learning_rate, declared=None
):
    """Keras' `_backend_update_step`'s work, sharded over the replicas.

    Called in a replica context, from the optimizer's gradient all-reduce.

    Args:
        optimizer: The Keras optimizer (a `LossScaleOptimizer`'s inner one runs).
        grads: This replica's gradients, one per variable.
        trainable_variables: The variables, in `grads`' order.
        learning_rate: The step's learning rate.
        declared: The replica step's declared sample count
            (`_replicator_state.SampleCount`), or None. Defaults to `None`.
    """
    context = tf.distribute.get_replica_context()
    strategy = _compat.optimizer.optimizer_strategy(optimizer)
    if context is None or tf.distribute.in_cross_replica_context():
        raise RuntimeError(
            "An optimizer built under `kr.AllReduceOptions(shard_weight_update="
            "True)` holds one piece of its state per replica, so it can only "
            "update inside a replica step (`fit`, `run_steps` or `strategy.run`). "
            f"Received: a call of {type(optimizer).__name__}.apply outside "
            "`strategy.run`."
        )
    _support.check_supported(optimizer)
    variables = list(trainable_variables)
    # A piece of an IndexedSlices gradient has no meaning (its rows may repeat).
    grads = [_gradient_form.dense_like(g, v) for g, v in zip(grads, variables)]
    average = _reduction.averages(optimizer, _compat.is_replicator(strategy), declared)
    grads, exact = _reduction.prepare_sum(grads, average, declared)
    options = _strategy_transport.options_of(context.strategy)
    transport = _strategy_transport.transport_for(context.strategy, options)
    buckets = _buckets.plan_by_dtype(grads, transport.bucket_bytes(options))
    total = None
    carriers = _buckets.EXACT_CARRIERS
    if exact and not any(grads[b[0]].dtype in carriers for b in buckets):
        # No bucket can carry the counts exactly: they travel first, alone.
        total = _exchange.sum_small(transport, exact[0])
    rule = _norm_rules.rule_for(_support.updating_optimizer(optimizer))
    replica = context.replica_id_in_sync_group
    num_replicas = context.num_replicas_in_sync
    pieces = _slots.piece_variables(optimizer, variables, strategy)
    targets, values = [], []
    with _slots.aliased(optimizer, pieces, variables):
        reduced = []  # per bucket: (layout, this replica's pieces of the sums)
        for bucket in buckets:
            carry = exact if total is None else []
            layout = _layout.Layout([variables[i].shape for i in bucket], num_replicas)
            summed, summed_exact = _exchange.reduce_scatter(
                transport,
                options.compression,
                layout,
                [grads[i] for i in bucket],
                carry,
                replica,
            )
            if carry:
                total = summed_exact[0]
            reduced.append((layout, summed))
        if exact:
            reduced = [(lay, _reduction.finish_sum(s, total)) for lay, s in reduced]
        if _clipping.defers(optimizer):
            reduced = _clipped(optimizer, transport, reduced)
        for bucket, (layout, summed) in zip(buckets, reduced):
            for j, i in enumerate(bucket):
                pieces[i].assign(layout.piece_of(_read(variables[i]), j, replica))
            if rule is None:
                for i, gradient in zip(bucket, summed):
                    optimizer.update_step(gradient, pieces[i], learning_rate)
            else:
                _two_half_updates(
                    rule, transport, [pieces[i] for i in bucket], summed, learning_rate
                )
            updated = [pieces[i].read_value() for i in bucket]
            gathered = _exchange.all_gather(transport, tf.concat(updated, axis=0))
            for i, value in zip(bucket, layout.unpack(gathered)):
                targets.append(_raw(variables[i]))
                values.append(value)
    _compat.strategy.assign_in_every_replica(strategy, targets, values)


def _clipped(optimizer, transport, reduced):
    """Keras' clipping of the pieces of every bucket: the norms are the whole
    gradients' (one small all-reduce of the pieces' sums of squares)."""
    flat = [g for _, summed in reduced for g in summed]
    clipped = _clipping.clip_pieces(
        optimizer, flat, lambda squares: _exchange.sum_small(transport, squares)
    )
    result, start = [], 0
    for layout, summed in reduced:
        result.append((layout, clipped[start : start + len(summed)]))
        start += len(summed)
    return result


def _two_half_updates(rule, transport, pieces, gradients, learning_rate) -> None:
    """A bucket's steps of a norm optimizer: halves around one all-reduce."""
    partial = [rule.partial(g, piece) for g, piece in zip(gradients, pieces)]
    squares = [tf.convert_to_tensor(s) for s, _ in partial]
    # Summed in float64 (TPUs have no float64 collectives: float32 there).
    wide = tf.float64
    if isinstance(tf.distribute.get_strategy(), tf.distribute.TPUStrategy):
        wide = tf.float32
    total = _exchange.sum_small(
        transport, tf.stack([tf.cast(s, wide) for s in squares])
    )
    for k, (g, piece) in enumerate(zip(gradients, pieces)):
        summed = tf.cast(total[k], squares[k].dtype)
        rule.finish(g, piece, learning_rate, summed, partial[k][1])


def _raw(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


def _read(variable):
    return tf.convert_to_tensor(_raw(variable))
