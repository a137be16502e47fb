"""A sharded slot reads and writes whole: gathered on read, cut into pieces on write.

A sharded optimizer's `variables` list its one-piece slots where an unsharded
one lists whole slots, in the same order. Keras writes an optimizer's state
(`.keras`, `.weights.h5`, `ModelCheckpoint`, `BackupAndRestore`) through
`save_own_variables`, which stores `variable.numpy()` for each of them, and
loads it through `load_own_variables`, which calls `variable.assign(value)`.
A sharded slot is a `PieceSlot`, a `keras.Variable` whose public `numpy()`
gathers the replicas' pieces into the whole value and whose `assign()` cuts a
whole value into the pieces this strategy's replicas own. So the optimizer
itself is the user's, unchanged: the file is the one an unsharded run writes,
and it loads with or without sharding, on any replica count, or on one device.
The optimizer's own update writes the pieces through the `tf.Variable` under
the slot (`optimizer.assign` and friends), never through `PieceSlot.assign`.

Gathering is a collective over all replicas, so every worker must save (as
`_files/worker_files` has every worker save, the chief publishing).
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from keras_replicator import _compat
from keras_replicator.communication import _strategy_transport


class PieceSlot(keras.Variable):
    """An optimizer slot holding one piece per replica; it reads and writes whole.

    Its `shape` is one piece's, `(L,)` (`_layout.piece_length`); under a
    mirrored strategy each device's copy holds its own replica's piece (no
    aggregation, so a replica's assignment stays on its device). `numpy()`
    returns the whole value (`whole_shape`), `assign(value)` takes one.

    Args:
        whole_shape: The shape of the model variable the slot is "like".
        strategy: The strategy whose replicas hold the pieces.
        **kwargs: `keras.Variable`'s arguments (a 1-D piece's `shape`).

    Example (one replica: its piece is the whole, flattened):
    >>> import tensorflow as tf
    >>> strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    >>> with strategy.scope():
    ...     slot = PieceSlot((2, 2), strategy, initializer="ones", shape=(4,))
    >>> slot.numpy().tolist()
    [[1.0, 1.0], [1.0, 1.0]]
    >>> _ = slot.assign([[1.0, 2.0], [3.0, 4.0]])
    >>> slot.value.numpy().tolist()
    [1.0, 2.0, 3.0, 4.0]
    """

    def __init__(self, whole_shape, strategy, **kwargs):
        super().__init__(trainable=False, **kwargs)
        self.whole_shape = tuple(whole_shape)
        self.strategy = strategy

    @property
    def size(self) -> int:
        """Elements of the whole value (the pieces hold padding beyond it)."""
        return math.prod(self.whole_shape)

    def numpy(self) -> np.ndarray:
        """The whole value, gathered from every replica's piece (eager)."""
        return _gather(self.strategy, [self])[0]

    def assign(self, value):
        """Cuts the whole `value` into pieces, one to each replica (eager)."""
        value = np.asarray(value)
        _scatter(self.strategy, [(self, value)])
        return self.value


def _gather(strategy, slots) -> list:
    """The whole value of each of `slots` (one dtype): one all-gather for all."""
    matrix = _gather_rows(strategy, slots)
    result, start = [], 0
    for slot in slots:
        length = slot.shape[0]
        pieces = matrix[:, start : start + length]
        start += length
        result.append(pieces.reshape(-1)[: slot.size].reshape(slot.whole_shape))
    return result


def _gather_rows(strategy, group) -> np.ndarray:
    """`[N, C]`: every replica's pieces of the slots in `group`, side by side.

    Without a collective where possible: one process's replicas are the
    variables' local copies (in replica order); the socket ring gathers numpy
    arrays directly. Otherwise one `all_gather` in a `tf.function`.
    """
    components = [_local_copies(s) for s in group]
    if _all_local(strategy):
        rows = [
            np.concatenate([c[k].numpy() for c in components])
            for k in range(strategy.num_replicas_in_sync)
        ]
        return np.stack(rows)
    ring = _ring(strategy)
    if ring is not None:
        row = np.concatenate([c[0].numpy() for c in components])
        return ring.all_gather(row).reshape(strategy.num_replicas_in_sync, -1)

    def rows():
        context = tf.distribute.get_replica_context()
        row = tf.concat([tf.convert_to_tensor(s.value) for s in group], 0)
        return context.all_gather(row[None, :], axis=0)

    result = tf.function(lambda: strategy.run(rows))()
    return strategy.experimental_local_results(result)[0].numpy()


def _local_copies(variable) -> list:
    raw = variable.value
    return list(getattr(raw, "values", [raw]))


def _all_local(strategy) -> bool:
    return len(strategy.extended.worker_devices) == strategy.num_replicas_in_sync


def _ring(strategy):
    if len(strategy.extended.worker_devices) != 1:
        return None
    # The ring's rank is this worker's replica id (`ring/_setup.share`), so
    # its gathered rows are in replica order. Called eagerly on numpy arrays,
    # outside any replica context: the ring itself, not a `Transport`.
    return _strategy_transport.ring_of(strategy)


def _scatter(strategy, pairs) -> None:
    """Assigns each replica its piece of each `(slot, whole value)`."""
    if not pairs:
        return
    num_replicas = strategy.num_replicas_in_sync
    matrices = []
    for slot, value in pairs:
        if tuple(value.shape) != slot.whole_shape:
            raise ValueError(
                f"The saved optimizer state for {slot.path!r} must have "
                f"its variable's shape {slot.whole_shape}. Received: shape "
                f"{tuple(value.shape)}. Load a file saved from this model."
            )
        length = slot.shape[0]
        flat = np.zeros([num_replicas * length], value.dtype)
        flat[: slot.size] = value.reshape(-1)
        matrices.append(flat.reshape(num_replicas, length))

    if _all_local(strategy):
        for (slot, _), matrix in zip(pairs, matrices):
            for k, copy in enumerate(_local_copies(slot)):
                copy.assign(matrix[k])
        return
    ring = _ring(strategy)
    if ring is not None:
        for (slot, _), matrix in zip(pairs, matrices):
            _local_copies(slot)[0].assign(matrix[ring.replica])
        return

    def piece(matrices):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        for (slot, _), matrix in zip(pairs, matrices):
            slot.value.assign(tf.gather(matrix, replica))

    @tf.function
    def assign(matrices):
        strategy.run(piece, args=(matrices,))

    assign([tf.constant(m) for m in matrices])


def make_checkpointable(slot: PieceSlot) -> None:
    """Makes `tf.train.Checkpoint` save `slot` whole and restore it into pieces.

    TensorFlow's checkpoints read a mirrored variable's first copy, which holds
    only replica 0's piece here; the slot's own serialization gathers instead.
    """

    def serialize():
        return {"VARIABLE_VALUE": tf.constant(slot.numpy())}

    def restore(restored):
        slot.assign(restored["VARIABLE_VALUE"])
        return slot.value

    _compat.optimizer.override_checkpointing(slot, serialize, restore)
