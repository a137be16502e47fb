"""The reduction rule for Keras' `gradient_accumulation_steps` under our strategies.

Each replica accumulates its own gradients (`_compat/accumulation.py` keeps them
local and all-reduces once per update), so the rule of `communication/_reduction`
applies to the whole accumulation cycle instead of to one step:

* where the library knows each replica's sample count (`fit`, `run_steps`,
  `kr.wrap_optimizer`), a replica accumulates its *weighted* gradients
  ``sum_t n_rt * g_rt`` and its sample count ``sum_t n_rt``; the update divides
  the all-reduced sum by the all-reduced count. The result is the gradient of the
  mean loss over every sample of the cycle: one device at the effective batch
  ``k * B``. With micro-batches of equal global size that is also exactly what
  Keras computes on one device with accumulation (the mean of the micro-batch
  means); when they differ (a short last batch of an epoch inside a cycle), Keras'
  one-device mean gives the short batch's samples more weight, and we weigh every
  sample the same. Keeping Keras' weighting would need every micro-step's global
  count, i.e. a collective per micro-step.
* in a plain `strategy.run` loop (the stock contract: the optimizer sums), and
  with one replica in sync, the accumulators hold plain gradients and the update
  uses Keras' own formula, ``(g_k + sum_t<k g_t) / k``, then sums over replicas as
  any stock update does; with one replica that is Keras' step bit for bit. As
  under stock Keras, a gradient that is one tensor on every replica (made outside
  `strategy.run`) is then counted once per replica: the sum with the replica's
  accumulator makes it a per-replica value.

The sample counts live in a per-optimizer variable outside the optimizer's own
variables (saved files stay those of one device); a checkpoint restored in the
middle of a cycle restores Keras' accumulators but restarts that count, so resume
at cycle boundaries (`steps_per_epoch` a multiple of the accumulation steps).
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from keras_replicator import _compat
from keras_replicator.communication import _reduction
from keras_replicator.keras_integration import _sample_count


def accumulates_per_replica(optimizer) -> bool:
    """Whether this update runs in a replica context of one of our strategies."""
    del optimizer  # every optimizer: Keras' own, LARS, Neumann, NLCG, ...
    if not _compat.is_replicator_current():
        return False
    return tf.distribute.get_replica_context() is not None


def weigh_micro_batch(optimizer, grads):
    """`(gradients to accumulate, sample count or None)` for one micro-step.

    With a count, the gradients carry it (``n * g``, or already so when the loss
    was scaled by it) and the update divides by the cycle's summed count; with
    None, the update takes Keras' mean over the micro-steps.
    """
    grads = [_dense(g) for g in grads]
    declared = _sample_count.declared()
    if _reduction.single_replica() or not _reduction.averages(
        optimizer, on_replicator=True, declared=declared
    ):
        # As Keras accumulates under stock strategies: a gradient that is one
        # tensor on every replica becomes a per-replica sum with the accumulator
        # and is then summed once per replica, as the Keras distribute test expects.
        return grads, None
    weighed, exact = _reduction.prepare_sum(grads, average=True, declared=declared)
    return weighed, exact[0]


def reducing_accumulated(count):
    """Where the update's all-reduce finds the cycle's gradients weighted by
    `count` samples (this replica's), or the stock rule when `count` is None."""
    if count is None:
        return contextlib.nullcontext()
    return _sample_count.counting_samples(count, loss_scaled=True)


def _dense(gradient):
    # The accumulators are dense; an Embedding's IndexedSlices is added densely,
    # as Keras' own accumulation does.
    if isinstance(gradient, tf.IndexedSlices):
        return tf.convert_to_tensor(gradient)
    return gradient
