"""The reduction rule of the gradient all-reduce: what is summed, and divided by what.

Two conventions for what a replica's loss means exist, and code written for one
gives the wrong learning rate under the other:

* **Per-replica mean** (Keras `fit`, TF-Replicator's `wrap_optimizer`): each replica
  averages over its own samples; the gradients must be *averaged* over replicas.
* **Share of the global mean** (TensorFlow's custom-loop contract): each replica
  divides by the global batch (`tf.nn.compute_average_loss`, or a Keras loss object,
  which divides by `num_replicas_in_sync` inside a replica); the optimizer *sums*.

The rule: where the library knows the convention, because it declared the replica's
sample count (`fit` / `evaluate` steps, custom `train_step`s inside `fit`,
`run_steps`) or because the optimizer went through `kr.wrap_optimizer`, gradients
are averaged, weighted by sample counts: ``sum_r(n_r * g_r) / sum_r(n_r)``, the
gradient of the global-batch mean whatever the split (an uneven last batch, a replica
with no samples). Everywhere else (a plain `strategy.run` loop) the stock contract
holds: gradients are summed and Keras loss objects scale by ``1/N`` (see
`keras_integration/_hooks.KerasHooks`), so code written for stock tf.distribute
keeps its numbers; like stock, a gradient that is one object on every replica
(made outside `strategy.run`) counts once per worker. Both paths send their bytes
through `_all_reduce.all_reduce_sum`.

The weighted mean costs one collective: the counts ride with the gradients. When the
loss already carries the count (``optimizer.scale_loss``, see
`keras_integration/_sample_count`), the gradients are only summed before the division.

The rule sits in `communication/`, below both its users: `keras_integration/` (Keras'
all-reduce, gradient accumulation) and `sharding/` (the sharded update, which sums by
reduce-scatter). Both read the step's declared sample count once, where Keras hands
them control, and pass it here (`declared`, a `_replicator_state.SampleCount` or
None); nothing here looks it up.

With one replica in sync (one device, or a cluster of one worker) both rules are the
identity, so nothing is scaled, packed or divided: the step is Keras' own step and
its dense gradients are bit for bit a plain step's (`single_replica`, and
`_hooks.KerasHooks.scale_loss`, which then leaves the loss alone). Embedding gradients
(`tf.IndexedSlices`) are the exception, with any number of replicas: they reach
the optimizer with each row once, so Adam sees the dense gradient
(`_gradient_form`).
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator._replicator_state import SampleCount, marked_averaging
from keras_replicator.communication import _all_reduce, _gradient_form
from keras_replicator.communication._division import divide


def averages(optimizer, on_replicator: bool, declared: SampleCount | None) -> bool:
    """Whether this all-reduce is a weighted mean (else: the stock sum).

    Args:
        optimizer: The optimizer reducing; `kr.wrap_optimizer` marks it to average.
        on_replicator: Whether the current strategy is one of ours.
        declared: The replica step's declared sample count, or None.
    """
    if marked_averaging(optimizer):
        return True
    return on_replicator and declared is not None


def all_reduce(grads_and_vars, average: bool, declared: SampleCount | None = None):
    """Reduces `grads_and_vars` over replicas; `None` gradients pass through.

    Args:
        grads_and_vars: `(gradient, variable)` pairs of one replica.
        average: The sample-weighted mean if True, else the plain sum.
        declared: The replica step's declared sample count (the mean's weight),
            or None (weight 1). Defaults to `None`.

    Returns:
        The pairs with reduced gradients, in the same order.
    """
    grads_and_vars = list(grads_and_vars)
    if tf.distribute.get_replica_context() is None:
        return grads_and_vars
    if single_replica():
        return [(_one_replica_form(g), v) for g, v in grads_and_vars]
    present = [i for i, (g, _) in enumerate(grads_and_vars) if g is not None]
    if not present:
        return grads_and_vars
    gradients = [_gradient_form.shaped_like(*grads_and_vars[i]) for i in present]
    gradients, exact = prepare_sum(gradients, average, declared)
    # Divided by the summed count where it rides (`exact`), in the transport
    # when it can (`_division`), else after it.
    gradients, _ = _all_reduce.all_reduce_sum(
        gradients, exact=exact, divide_by_exact=bool(exact)
    )
    result = list(grads_and_vars)
    for i, grad in zip(present, gradients):
        result[i] = (grad, grads_and_vars[i][1])
    return result


def _one_replica_form(gradient):
    """An embedding gradient with each row once (`_gradient_form`); others as is."""
    if isinstance(gradient, tf.IndexedSlices):
        return _gradient_form.sum_repeated_rows(gradient)
    return gradient


def single_replica() -> bool:
    """Whether the current strategy has one replica in sync (reductions are no-ops)."""
    return tf.distribute.get_strategy().num_replicas_in_sync == 1


def _count_shared_once(gradients):
    """Scales a gradient that is one object on every local replica by 1/replicas.

    Stock tf.distribute sums such a value (a tensor made outside `strategy.run`,
    as Keras' `optimizer_distribute_test.test_ema` does) once per worker, not once
    per replica: regrouping sees the same object and does not wrap it per replica.
    The packed all-reduce cannot see that, so the shares are fixed first.
    """
    context = tf.distribute.get_replica_context()
    local_replicas = len(context.strategy.extended.worker_devices)
    if local_replicas == 1:
        return gradients
    shared = context.merge_call(
        lambda _, *values: [
            not isinstance(v, tf.distribute.DistributedValues) for v in values
        ],
        args=tuple(gradients),
    )
    return [
        _scale(g, 1.0 / local_replicas) if is_shared else g
        for g, is_shared in zip(gradients, shared)
    ]


def prepare_sum(gradients, average: bool, declared: SampleCount | None = None):
    """One replica's share of the reduction: `(tensors to sum, exact scalars)`.

    For the weighted mean, each gradient is weighted by the replica's sample
    count `declared` (unless the loss already carries it: the first reduction
    of the step consumes that mark) and the count rides along as an exact
    scalar; for the stock sum, a gradient shared by the local replicas is
    counted once (`_count_shared_once`). The sum is any transport's: an
    all-reduce here, a reduce-scatter under weight-update sharding.
    """
    if not average:
        return _count_shared_once(gradients), []
    if declared is None or declared.equal_weights:
        weight = tf.constant(1.0)
    else:
        weight = tf.cast(declared.count, tf.float32)
    if declared is None or not declared.take_scaled_loss():
        gradients = [_scale(g, weight) for g in gradients]
    return gradients, [weight]


def finish_sum(summed, total=None):
    """The reduced gradients from their sum: divided by the summed count, if any
    (`_division.divide`: a product with the reciprocal below float64)."""
    if total is None:
        return list(summed)
    return [divide(g, total) for g in summed]


def _scale(grad, factor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            grad.values * tf.cast(factor, grad.values.dtype),
            grad.indices,
            grad.dense_shape,
        )
    return grad * tf.cast(factor, grad.dtype)
