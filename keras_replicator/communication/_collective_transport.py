"""TensorFlow's collectives as a `Transport` (`MultiDeviceReplicator`, GPUs, TPUs).

A bucket travels as one flat buffer (`_buckets.flatten`), the exact scalars
appended to it; its sums are divided after the collective, where the division
would happen anyway (TensorFlow's collectives cannot divide in transit). With an
`AllReduceOptions.hierarchy`, each sum runs over native sub-groups
(`_hierarchy.sum_over_replicas`: local-then-global or Ying et al.'s 2-D). The
reduce-scatter is NCCL's on GPU replicas (`_hierarchy.reduce_scatter_over_replicas`:
`1/N` of the bytes to each replica), and an all-reduce and a slice elsewhere
(TensorFlow has no CPU reduce-scatter) or under a hierarchy (whose sums already
cross the grid). The step's logs are TensorFlow's batched MEAN, one per dtype.
Collectives run on threads of their own, so every bucket may travel while the
backward pass computes: the buckets are `AllReduceOptions`' size.

Example:
>>> import keras_replicator as kr
>>> options = kr.AllReduceOptions(transport="collective")
>>> CollectiveTransport(options).bucket_bytes(options) / 1e6
16.0
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator.communication import _buckets, _division, _hierarchy
from keras_replicator.communication._transport import Transport
from keras_replicator.communication.options import AllReduceOptions


class CollectiveTransport(Transport):
    """TensorFlow's collectives, or the hierarchical sums over sub-groups.

    Args:
        options: The resolved all-reduce options (`hierarchy`, `group_size`).
        collective_timeout: Seconds a collective waits for its peers, or None.
            Defaults to `None`.
        nccl: Whether the replicas may run NCCL (`_platform.nccl_usable`).
            Defaults to False.
        keys: Collective keys shared with the strategy's own transport, or None.
            Defaults to `None`.
    """

    def __init__(
        self,
        options: AllReduceOptions,
        collective_timeout: float | None = None,
        *,
        nccl: bool = False,
        keys: _hierarchy.CollectiveKeys | None = None,
    ):
        super().__init__(options, collective_timeout, keys)
        self._nccl = nccl

    def _sum_one(self, value):
        if self.options.hierarchy is not None:
            return _hierarchy.sum_over_replicas(
                value,
                self.options.hierarchy,
                self.options.group_size,
                self.collective_timeout,
                keys=self.collective_keys,
            )
        context = tf.distribute.get_replica_context()
        return context.all_reduce(tf.distribute.ReduceOp.SUM, value)

    def sum(self, values) -> list[tf.Tensor]:
        return [self._sum_one(value) for value in values]

    def sum_bucket(self, members, exact=(), divide_by=None) -> tuple[list, list]:
        dtype = members[0].dtype
        flat = _buckets.flatten(members)
        if exact:
            flat = tf.concat([flat, tf.cast(tf.stack(exact), dtype)], axis=0)
        flat = self._sum_one(flat)
        summed_exact = []
        if exact:
            summed_exact = tf.unstack(tf.cast(flat[-len(exact) :], tf.float32))
            flat = flat[: -len(exact)]
        sums = _buckets.unflatten(flat, members)
        if divide_by is not None:
            sums = [_division.divide(s, divide_by) for s in sums]
        return sums, summed_exact

    def sum_counted(self, members, counts) -> tuple[list, list]:
        if members[0].dtype in _buckets.EXACT_CARRIERS:
            sums, summed = self.sum_bucket(members, counts)
            return [_division.divide(s, summed[0]) for s in sums], summed
        # A 16-bit bucket cannot hold a count exactly: the counts go first, alone.
        (total,) = self.sum([tf.stack(counts)])
        summed = tf.unstack(total)
        sums, _ = self.sum_bucket(members, divide_by=summed[0])
        return sums, summed

    def mean(self, values) -> list[tf.Tensor]:
        """TensorFlow's batched MEAN all-reduce, one per dtype (its batch
        concatenates the values)."""
        context = tf.distribute.get_replica_context()
        by_dtype: dict = {}
        for i, value in enumerate(values):
            by_dtype.setdefault(value.dtype, []).append(i)
        means: list = [None] * len(values)
        for indices in by_dtype.values():
            group = [values[i] for i in indices]
            reduced = context.all_reduce(tf.distribute.ReduceOp.MEAN, group)
            for i, mean in zip(indices, reduced):
                means[i] = mean
        return means

    def reduce_scatter(self, matrix) -> tf.Tensor:
        """This replica's row of the sum: NCCL's reduce-scatter on GPUs.

        Elsewhere, or under a hierarchy, an all-reduce and this replica's row:
        correct, no saving of bytes.
        """
        if self.options.hierarchy is None and self._nccl:
            return _hierarchy.reduce_scatter_over_replicas(
                matrix, self.collective_timeout, keys=self.collective_keys
            )
        context = tf.distribute.get_replica_context()
        summed = self._sum_one(tf.reshape(matrix, [-1]))
        replica = context.replica_id_in_sync_group
        return tf.gather(tf.reshape(summed, matrix.shape), replica)

    def all_gather(self, row) -> tf.Tensor:
        context = tf.distribute.get_replica_context()
        return context.all_gather(row[None, :], axis=0)

    def bucket_bytes(self, options: AllReduceOptions) -> float:
        return options.resolved_bucket_bytes()
