"""Saved optimizer state is whole: gathered on save, cut into pieces on load.

A sharded optimizer's `variables` list its one-piece slots where an unsharded
one lists whole slots, in the same order. Keras writes an optimizer's state
(`.keras`, `.weights.h5`, `ModelCheckpoint`, `BackupAndRestore`) through
`save_own_variables` as that list, so the sharded slots are written gathered
into their variables' shapes: the file is the one an unsharded run writes, and
it loads with or without sharding, on any replica count, or on one device.
Loading into a sharded optimizer cuts each whole slot into the pieces this
strategy's replicas own.

Gathering is a collective over all replicas, so every worker must save (as
`_files/worker_files` has every worker save, the chief publishing).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_replicator import _compat
from keras_replicator.communication import _transport
from keras_replicator.sharding import _slots, _support


def _all_sharded(optimizer) -> dict:
    """{id(variable): ShardedSlot} of `optimizer` and the optimizer it wraps."""
    found = {}
    for owner in (optimizer, _support.updating_optimizer(optimizer)):
        for slot in _slots.sharded_slots(owner):
            found[id(slot.variable)] = slot
    return found


def values_to_save(optimizer) -> list | None:
    """The arrays Keras' `save_own_variables` writes; None if nothing is sharded."""
    sharded = _all_sharded(optimizer)
    if not sharded:
        return None
    gathered = _gather(optimizer, list(sharded.values()))
    return [
        gathered[id(v)] if id(v) in sharded else v.numpy() for v in optimizer.variables
    ]


def load(optimizer, store) -> bool:
    """Loads Keras' `store` into a sharded optimizer; False if nothing is sharded
    or the counts differ (Keras' own load then warns and skips)."""
    sharded = _all_sharded(optimizer)
    variables = optimizer.variables
    if not sharded or len(store.keys()) != len(variables):
        return False
    whole = []
    for i, variable in enumerate(variables):
        value = np.asarray(store[str(i)])
        if id(variable) in sharded:
            whole.append((sharded[id(variable)], value))
        else:
            variable.assign(value)
    _scatter(optimizer, whole)
    return True


def _strategy(optimizer):
    return _compat.optimizer.optimizer_strategy(_support.updating_optimizer(optimizer))


def _gather(optimizer, slots) -> dict:
    """{id(slot variable): whole value} for `slots`, one all-gather per dtype."""
    strategy = _strategy(optimizer)
    result = {}
    for dtype in sorted({s.variable.dtype for s in slots}):
        group = [s for s in slots if s.variable.dtype == dtype]

        matrix = _gather_rows(strategy, group)
        start = 0
        for slot in group:
            length = slot.variable.shape[0]
            pieces = matrix[:, start : start + length]
            start += length
            result[id(slot.variable)] = pieces.reshape(-1)[: slot.size].reshape(
                slot.shape
            )
    return result


def _gather_rows(strategy, group) -> np.ndarray:
    """`[N, C]`: every replica's pieces of the slots in `group`, side by side.

    Without a collective where possible: one process's replicas are the
    variables' local copies (in replica order); the socket ring gathers numpy
    arrays directly. Otherwise one `all_gather` in a `tf.function`.
    """
    components = [_local_copies(s.variable) for s in group]
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
        row = tf.concat([tf.convert_to_tensor(s.variable.value) for s in group], 0)
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
    return _transport.ring_of(strategy)


def _scatter(optimizer, pairs) -> None:
    """Assigns each replica its piece of each `(slot, whole value)`."""
    if not pairs:
        return
    strategy = _strategy(optimizer)
    num_replicas = strategy.num_replicas_in_sync
    matrices = []
    for slot, value in pairs:
        if tuple(value.shape) != slot.shape:
            raise ValueError(
                f"The saved optimizer state for {slot.variable.path!r} must have "
                f"its variable's shape {slot.shape}. Received: shape "
                f"{tuple(value.shape)}. Load a file saved from this model."
            )
        length = slot.variable.shape[0]
        flat = np.zeros([num_replicas * length], value.dtype)
        flat[: slot.size] = value.reshape(-1)
        matrices.append(flat.reshape(num_replicas, length))

    if _all_local(strategy):
        for (slot, _), matrix in zip(pairs, matrices):
            for k, copy in enumerate(_local_copies(slot.variable)):
                copy.assign(matrix[k])
        return
    ring = _ring(strategy)
    if ring is not None:
        for (slot, _), matrix in zip(pairs, matrices):
            _local_copies(slot.variable)[0].assign(matrix[ring.replica])
        return

    def piece(matrices):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        for (slot, _), matrix in zip(pairs, matrices):
            slot.variable.value.assign(tf.gather(matrix, replica))

    @tf.function
    def assign(matrices):
        strategy.run(piece, args=(matrices,))

    assign([tf.constant(m) for m in matrices])


def make_checkpointable(optimizer, slot) -> None:
    """Makes `tf.train.Checkpoint` save `slot` whole and restore it into pieces.

    TensorFlow's checkpoints read a mirrored variable's first copy, which holds
    only replica 0's piece here; the slot's own serialization gathers instead.
    """
    variable = slot.variable

    def serialize():
        return {"VARIABLE_VALUE": tf.constant(_gather(optimizer, [slot])[id(variable)])}

    def restore(restored):
        value = restored["VARIABLE_VALUE"]
        _scatter(optimizer, [(slot, np.asarray(value))])
        return variable.value

    _compat.optimizer.override_checkpointing(variable, serialize, restore)
