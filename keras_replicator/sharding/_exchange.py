"""The two halves of an all-reduce, for weight-update sharding.

`reduce_scatter` leaves row `r` of the summed `[N, C]` bucket matrix on replica
`r`; `all_gather` rebuilds the matrix from every replica's row. Together they
move the bytes of one all-reduce, and the optimizer runs between them on a
replica's row only.

Transports, by what the strategy has:

- the socket ring (`MultiWorkerReplicator`, CPU workers, no compression): its
  own reduce-scatter and all-gather phases, so sharding costs no extra traffic;
  the exact scalars (sample counts) ride in every row, uncompressed;
- anything else (TensorFlow's collectives, a hierarchy, compression, a TPU):
  the bucket is all-reduced through `communication._all_reduce` with the
  strategy's options and sliced, the exact scalars riding uncompressed as for
  any all-reduce, and the rows are gathered with the replica context's
  `all_gather`: correct, one all-gather of extra traffic, no speed gain from
  the split.
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


def reduce_scatter(layout, tensors, exact, replica):
    """This replica's pieces of the sums of `tensors`, and the sums of `exact`.

    Args:
        layout: The bucket's `_layout.Layout` (no extra columns).
        tensors: This replica's members of the bucket (one dtype).
        exact: Float32 scalars every replica needs summed exactly (sample
            counts); may be empty.
        replica: This replica's id in the sync group.

    Returns:
        `(pieces, summed_exact)`: one 1-D summed piece per member, and the
        summed scalars (a list, empty if `exact` is).
    """
    strategy = tf.distribute.get_strategy()
    ring = _ring(strategy, tensors[0].dtype)
    if ring is not None:
        carrying = layout.with_extra_columns(len(exact))
        flat = tf.reshape(carrying.pack(tensors, exact), [-1])
        (row,) = _all_reduce.ring_call(
            ring.reduce_scatter,
            [flat],
            [tf.TensorShape([carrying.row_length])],
            "reduce_scatter",
        )
        pieces, extra = carrying.split_row(row)
        summed_exact = tf.unstack(tf.cast(extra, tf.float32)) if exact else []
        return pieces, summed_exact
    options = dataclasses.replace(_all_reduce.options_of(strategy), bucket_mb=0)
    (summed,), summed_exact = _all_reduce.all_reduce_sum(
        [layout.pack(tensors)], exact=exact, options=options
    )
    pieces, _ = layout.split_row(tf.gather(summed, replica))
    return pieces, summed_exact


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


def sum_small(tensor) -> tf.Tensor:
    """`tensor` summed over replicas exactly: never compressed, one buffer."""
    strategy = tf.distribute.get_strategy()
    options = dataclasses.replace(
        _all_reduce.options_of(strategy), compression=None, bucket_mb=0
    )
    (summed,), _ = _all_reduce.all_reduce_sum([tensor], options=options)
    return summed
