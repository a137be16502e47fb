"""The transport: the one object a strategy's replicas move gradient bytes through.

Every synchronous Replicator builds one `Transport` in its constructor and keeps
it in its `ReplicatorState` (a stock strategy gets one on first use, kept beside
it); from `train_step` to the wire and back, a gradient meets no other
communication object. There are two:

- `SocketTransport` (`_socket_transport`): our TCP ring between CPU workers
  (`communication/ring`), one replica each;
- `CollectiveTransport` (`_collective_transport`): TensorFlow's collectives, or
  the hierarchical sums over native sub-groups (`_hierarchy`).

Callers never ask a transport what it can do: each method says what is wanted,
and each transport does it its own best way. `sum_counted` sums a bucket with the
step's sample counts in one call and returns the bucket divided by the summed
count (the ring divides between its two phases, the collectives right after);
`sum_bucket` sums one bucket (one ring message, or one flat buffer); `mean`
averages the step's logs (which carry the preemption agreement,
`_worker/preemption.py`); `bucket_bytes` sizes the buckets for how the
transport's calls overlap the backward pass.

What travels (buckets, 16-bit wire formats) and in what order is decided above,
by `_all_reduce` for the gradient all-reduce and by `sharding/` for the
weight-update sharding; both get the strategy's transport from
`_strategy_transport.transport_for`.

Example:
>>> import tensorflow as tf
>>> from keras_replicator.communication._strategy_transport import transport_for
>>> transport = transport_for(tf.distribute.get_strategy())
>>> isinstance(transport, Transport), transport.options.transport
(True, 'collective')
"""

from __future__ import annotations

import abc

import tensorflow as tf

from keras_replicator.communication import _hierarchy
from keras_replicator.communication.options import AllReduceOptions


class Transport(abc.ABC):
    """How one strategy's replicas sum, scatter and gather (replica context).

    Args:
        options: The strategy's resolved `kr.AllReduceOptions`.
        collective_timeout: Seconds the strategy's collectives wait for their
            peers, or None (forever). Defaults to `None`.
        keys: The collective keys to share, or None (new ones). Defaults to
            `None`.

    Attributes:
        options: The strategy's resolved `kr.AllReduceOptions` (`transport` named).
        collective_timeout: As given.
        collective_keys: The instance-key counters and ordering tokens of the
            strategy's own sub-group collectives (`_hierarchy.CollectiveKeys`),
            shared by every collective transport made for the strategy.
    """

    def __init__(
        self,
        options: AllReduceOptions,
        collective_timeout: float | None = None,
        keys: _hierarchy.CollectiveKeys | None = None,
    ):
        self.options = options
        self.collective_timeout = collective_timeout
        self.collective_keys = _hierarchy.CollectiveKeys() if keys is None else keys

    @abc.abstractmethod
    def sum(self, values) -> list[tf.Tensor]:
        """Each of `values` (dense tensors) summed over every replica."""

    @abc.abstractmethod
    def sum_bucket(self, members, exact=(), divide_by=None) -> tuple[list, list]:
        """One bucket of same-dtype dense tensors summed, uncompressed.

        Args:
            members: The bucket's tensors (one dtype).
            exact: Float32 scalars summed exactly beside them (in the bucket's
                dtype, which must hold them: float32 or float64). Defaults to `()`.
            divide_by: A float32 scalar every sum is divided by
                (`_division.divide`), or None. Defaults to `None`.

        Returns:
            `(sums, summed exact)`: lists in the order given.
        """

    @abc.abstractmethod
    def sum_counted(self, members, counts) -> tuple[list, list]:
        """A bucket's sums divided by the summed `counts[0]`, and the summed counts.

        Args:
            members: The bucket's tensors (one dtype).
            counts: Float32 scalars (the step's sample counts), summed exactly.

        Returns:
            `(divided sums, summed counts)`: lists in the order given.
        """

    def sum_sparse(self, slices) -> list:
        """`tf.IndexedSlices` summed over every replica: TensorFlow's all-gather of
        the rows, on every transport (the ring moves dense buffers only)."""
        context = tf.distribute.get_replica_context()
        return context.all_reduce(tf.distribute.ReduceOp.SUM, list(slices))

    @abc.abstractmethod
    def mean(self, values) -> list[tf.Tensor]:
        """The mean over every replica of float tensors (the step's logs).

        Every replica gets the same bits, each value in its own dtype.
        """

    @abc.abstractmethod
    def reduce_scatter(self, matrix) -> tf.Tensor:
        """Row `r` of an `[N, C]` matrix summed over the replicas, on replica `r`."""

    @abc.abstractmethod
    def all_gather(self, row) -> tf.Tensor:
        """Every replica's `[C]` row, stacked in replica order: `[N, C]`."""

    @abc.abstractmethod
    def bucket_bytes(self, options: AllReduceOptions) -> float:
        """The gradient buckets' capacity in bytes (0: one bucket per dtype)."""
