"""The two halves of an all-reduce, for weight-update sharding.

`reduce_scatter` leaves row `r` of the summed `[N, C]` bucket matrix on replica
`r`; `all_gather` rebuilds the matrix from every replica's row. Together they
move the bytes of one all-reduce, and the optimizer runs between them on a
replica's row only.

Transports, by what the strategy has:

- the socket ring (`MultiWorkerReplicator`, CPU workers, no compression): its
  own reduce-scatter and all-gather phases, so sharding costs no extra traffic;
- anything else (TensorFlow's collectives, a hierarchy, compression, a TPU):
  the bucket is all-reduced through `communication._all_reduce` with the
  strategy's options and sliced, and the rows are gathered with the replica
  context's `all_gather`: correct, one all-gather of extra traffic, no speed
  gain from the split.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from keras_replicator.communication import _all_reduce, _compression


def _ring(strategy, dtype):
    ring = getattr(strategy, _all_reduce.RING_ATTRIBUTE, None)
    options = _all_reduce.options_of(strategy)
    if ring is None or options.transport != "socket":
        return None
    if _compression.compresses(options.compression, dtype):
        return None
    return ring


def uses_ring(strategy, dtype) -> bool:
    """Whether buckets of `dtype` travel through the ring's own two phases."""
    return _ring(strategy, dtype) is not None


def reduce_scatter(matrix, replica) -> tf.Tensor:
    """Row `replica` of the sum over replicas of `matrix` (`[N, C]`, replica context).

    Args:
        matrix: This replica's `[N, C]` bucket matrix (`_layout.Layout.pack`).
        replica: This replica's id in the sync group.

    Returns:
        The summed row, shape `[C]`.
    """
    strategy = tf.distribute.get_strategy()
    num_replicas, columns = matrix.shape
    ring = _ring(strategy, matrix.dtype)
    if ring is not None:
        flat = tf.reshape(matrix, [-1])
        (row,) = _all_reduce.ring_call(
            ring.reduce_scatter, [flat], [tf.TensorShape([columns])], "reduce_scatter"
        )
        return row
    options = dataclasses.replace(_all_reduce.options_of(strategy), bucket_mb=0)
    (summed,), _ = _all_reduce.all_reduce_sum([matrix], options=options)
    return tf.gather(summed, replica)


def all_gather(row) -> tf.Tensor:
    """Every replica's `row` (`[C]`), stacked in replica order: `[N, C]`."""
    context = tf.distribute.get_replica_context()
    strategy = context.strategy
    num_replicas = strategy.num_replicas_in_sync
    (columns,) = row.shape
    ring = _ring(strategy, row.dtype)
    if ring is not None:
        (flat,) = _all_reduce.ring_call(
            ring.all_gather,
            [row],
            [tf.TensorShape([num_replicas * columns])],
            "all_gather",
        )
        return tf.reshape(flat, [num_replicas, columns])
    return context.all_gather(row[None, :], axis=0)
