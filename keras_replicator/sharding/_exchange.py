"""The two halves of an all-reduce, for weight-update sharding.

`reduce_scatter` leaves row `r` of the summed `[N, C]` bucket matrix on replica
`r`; `all_gather` rebuilds the matrix from every replica's row. Together they
move the bytes of one all-reduce, and the optimizer runs between them on a
replica's row only.

Both go through the strategy's transport (`communication/_transport`), given by
the caller:

- the socket ring (`MultiWorkerReplicator`, CPU workers): its own reduce-scatter
  and all-gather phases, so sharding costs no extra traffic;
- TensorFlow's collectives (or a hierarchy, or a TPU): the bucket is all-reduced
  and sliced, and the rows are gathered with the replica context's
  `all_gather`: correct, one all-gather of extra traffic, no speed gain from
  the split.

The exact scalars (sample counts) ride in every row, uncompressed. With a 16-bit
wire (`compression`), the bucket travels as any all-reduce bucket does
(`_all_reduce.reduce_bucket`: compressed, the scalars beside it uncompressed) and
is sliced.
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator.communication import _all_reduce, _compression


def reduce_scatter(transport, compression, layout, tensors, exact, replica):
    """This replica's pieces of the sums of `tensors`, and the sums of `exact`.

    Args:
        transport: The step's `_transport.Transport`.
        compression: The wire format (`AllReduceOptions.compression`).
        layout: The bucket's `_layout.Layout` (no extra columns).
        tensors: This replica's members of the bucket (one dtype).
        exact: Float32 scalars every replica needs summed exactly (sample
            counts); may be empty.
        replica: This replica's id in the sync group.

    Returns:
        `(pieces, summed_exact)`: one 1-D summed piece per member, and the
        summed scalars (a list, empty if `exact` is).
    """
    if _compression.compresses(compression, tensors[0].dtype):
        (summed,), summed_exact = _all_reduce.reduce_bucket(
            transport, [layout.pack(tensors)], exact, compression
        )
        pieces, _ = layout.split_row(tf.gather(summed, replica))
        return pieces, summed_exact
    carrying = layout.with_extra_columns(len(exact))
    row = transport.reduce_scatter(carrying.pack(tensors, exact))
    pieces, extra = carrying.split_row(row)
    summed_exact = tf.unstack(tf.cast(extra, tf.float32)) if exact else []
    return pieces, summed_exact


def all_gather(transport, row) -> tf.Tensor:
    """Every replica's `row` (`[C]`), stacked in replica order: `[N, C]`."""
    return transport.all_gather(row)


def sum_small(transport, tensor) -> tf.Tensor:
    """`tensor` summed over replicas exactly: never compressed, one buffer."""
    return transport.sum([tensor])[0]
