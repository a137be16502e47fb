"""The number of samples the current replica is training on, for exact averaging.

Keras on stock tf.distribute divides every replica's mean loss by the replica count and
sums the gradients, which equals the one-device gradient only when every replica holds
the same number of samples. The last batch of an epoch is usually uneven, so the
weights drift (1.5e-3 after one epoch of 1001 samples on 4 replicas).

Our strategies instead leave each replica's loss as the mean over its own samples and
average the gradients weighted by each replica's sample count:
``g = sum_r(n_r * g_r) / sum_r(n_r)``, which is exactly the gradient of the mean loss
over the global batch.

The count travels from the step wrapper (which sees the batch) to the gradient
all-reduce (which sees only gradients) with Keras in between: `model.train_step`
(the user's or Keras'), `optimizer.apply_gradients` and Keras' all-reduce take no
extra argument. So this is the one side channel of the step, documented here and
kept in the strategy's `ReplicatorState.sample_counts` (`_replicator_state`): a
stack of `SampleCount`s per replica, keyed by the replica's id in the sync group
(static under every `MirroredStrategy`; a TPU step, whose id is a tensor, is traced
in one thread and keys by it). The id rather than the thread: MirroredStrategy
traces each replica in its own thread, and re-enters a replica from a `merge_call`
in a new thread (Keras' `LossScaleOptimizer` applying its inner optimizer, the
update branch of gradient accumulation), where the same replica must find its
count. The channel is read once, where Keras hands control back to the library
(`_hooks.KerasHooks`, `_accumulation`), and passed on as an argument
(`communication/_reduction`, `sharding/_update`).

Where the step asks the optimizer to scale its loss (`optimizer.scale_loss`, as
Keras' own `train_step` does), the count multiplies the loss *before* differentiation
instead, and the all-reduce only sums. The two are the same for ordinary layers, but
only the first is exact when the forward pass itself communicates across replicas
(synchronized batch norm, `replica.all_reduce`): the backward pass of a collective
sums the other replicas' upstream gradients, so their losses must already carry
their weights. With an uneven split (the last batch), weighting afterwards gave a
ResNet with `SyncBatchNormalization` gradients off by up to 2e-3 after one epoch.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import tensorflow as tf
from keras import tree

from keras_replicator._replicator_state import SampleCount, replicator_state


def _channel():
    """`(the strategy's declarations, this replica's key)`; `(None, None)` off ours."""
    state = replicator_state(tf.distribute.get_strategy())
    if state is None:
        return None, None
    context = tf.distribute.get_replica_context()
    replica = None
    if context is not None:
        replica = tf.get_static_value(context.replica_id_in_sync_group)
    key = ("thread", threading.get_ident()) if replica is None else int(replica)
    return state, key


@contextlib.contextmanager
def counting_samples(count: tf.Tensor, loss_scaled: bool = False) -> Iterator[None]:
    """Declares that the enclosed replica computation trains on `count` samples.

    Call in a replica context of one of our strategies (elsewhere: a no-op). With
    `loss_scaled`, its gradients already carry the count (an accumulation
    cycle's weighted sum, `_accumulation`): the all-reduce only sums them.
    """
    state, key = _channel()
    if state is None:
        yield
        return
    declared = SampleCount(count, loss_scaled)
    with state.lock:
        state.sample_counts.setdefault(key, []).append(declared)
    try:
        yield
    finally:
        with state.lock:
            stack = state.sample_counts[key]
            stack.remove(declared)
            if not stack:
                del state.sample_counts[key]


def declared() -> SampleCount | None:
    """This replica step's innermost declaration, or None if none (the stock rule)."""
    state, key = _channel()
    if state is None:
        return None
    with state.lock:
        stack = state.sample_counts.get(key)
        return stack[-1] if stack else None


def scale_loss_by_sample_count(loss):
    """Multiplies a replica's mean loss by its declared sample count, once.

    Marks the step so the gradient all-reduce sums without weighting again
    (`SampleCount.take_scaled_loss`). Without a declared count (or when already
    scaled) returns `loss` unchanged.
    """
    found = declared()
    if found is None or found.loss_scaled or found.equal_weights:
        return loss
    found.loss_scaled = True
    return loss * tf.cast(found.count, loss.dtype)


def batch_size_of(x) -> tf.Tensor:
    """Leading dimension of the first non-None leaf of `x`, as a float32 scalar."""
    for leaf in tree.flatten(x):
        if leaf is None:
            continue
        if isinstance(leaf, tf.RaggedTensor):
            return tf.cast(leaf.nrows(), tf.float32)
        if isinstance(leaf, tf.SparseTensor):
            return tf.cast(leaf.dense_shape[0], tf.float32)
        leaf = tf.convert_to_tensor(leaf)
        if leaf.shape.rank == 0:
            continue
        return tf.cast(tf.shape(leaf)[0], tf.float32)
    return tf.constant(1.0)
