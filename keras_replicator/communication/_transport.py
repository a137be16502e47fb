"""One small interface for moving bytes: the socket ring or TensorFlow's collectives.

A `Transport` sums, scatters and gathers dense tensors inside a replica context:

- `all_reduce(values, divide_by=None)`: each value summed over every replica
  (divided by `divide_by` inside the transport, where it `divides`);
- `reduce_scatter(matrix)`: of an `[N, C]` matrix summed over the replicas,
  replica `r` keeps row `r`;
- `all_gather(row)`: every replica's `[C]` row, stacked in replica order: `[N, C]`.

Two implement it. `SocketTransport` is our TCP ring (`MultiWorkerReplicator`, CPU
workers): it reads a list of tensors as one message (`fuses`), divides by a count
between its two phases (`divides`), and its reduce-scatter and all-gather are its
own phases (`scatters`: each moves `1/N` of an all-reduce's bytes); the sample
counts ride in a bucket's own call (`all_reduce_counted`). The
`CollectiveTransport` is TensorFlow's collectives (or `_hierarchy`'s sub-group
sums): one flat buffer per call. Its reduce-scatter is NCCL's on GPU replicas
(`_hierarchy.reduce_scatter_over_replicas`: `1/N` of the bytes to each replica),
and an all-reduce and a slice elsewhere (TensorFlow has no CPU reduce-scatter) or
under a `hierarchy` (whose sums already cross the grid).

`transport_for` is also where a stock strategy's wire format meets its platform
for the first time (`_compression.check_wire_format`, at trace time; our
strategies check in their constructors).

What travels (buckets, 16-bit wire formats, the exact sample counts) is decided
above, by `_all_reduce` for the gradient all-reduce and by `sharding/` for the
weight-update sharding; both get their transport from `transport_for`. The ring
object lives in the strategy's `ReplicatorState.transport`.
"""

from __future__ import annotations

import weakref
from typing import Protocol

import tensorflow as tf

from keras_replicator import _platform
from keras_replicator._replicator_state import replicator_state
from keras_replicator.communication import _compression, _hierarchy
from keras_replicator.communication.options import AllReduceOptions

# Per graph, the output of its last socket-ring call: the next one waits for it,
# so every worker runs them in the same (program) order.
_LAST_RING_OP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Transport(Protocol):
    """What `_all_reduce` and `sharding/` ask of a transport (replica context)."""

    fuses: bool  # sums a list of tensors as one message, without a flat copy
    # `all_reduce(..., divide_by=)` divides inside the transport, and
    # `all_reduce_counted(values, counts)` sums the counts in the same call
    divides: bool
    scatters: bool  # reduce-scatter / all-gather move 1/N of an all-reduce each
    # a call can run while the step's backward pass still computes (buckets pay)
    overlaps: bool

    def all_reduce(self, values, divide_by=None) -> list[tf.Tensor]: ...

    def reduce_scatter(self, matrix) -> tf.Tensor: ...

    def all_gather(self, row) -> tf.Tensor: ...


def ring_of(strategy):
    """The socket ring `strategy` sends its gradients through, or None."""
    state = replicator_state(strategy)
    if state is None or state.options is None:
        return None
    if state.options.transport != "socket":
        return None
    return state.transport


def transport_for(strategy, options: AllReduceOptions, context=None) -> Transport:
    """The transport `options` ask for on `strategy` (call in a replica context).

    Raises:
        ValueError: `transport='socket'` on a strategy that opened no ring, or
            a `compression` the strategy's platform cannot sum.
    """
    context = context or tf.distribute.get_replica_context()
    platform = _platform.platform_of(strategy)
    nccl = _platform.nccl_usable(strategy)
    _compression.check_wire_format(options.compression, platform, nccl=nccl)
    state = replicator_state(strategy)
    if options.transport == "socket":
        ring = None if state is None else state.transport
        if ring is None:
            raise ValueError(
                "`transport='socket'` needs a `MultiWorkerReplicator` built "
                "with it: `kr.MultiWorkerReplicator(all_reduce="
                "kr.AllReduceOptions(transport='socket'))`. Received: "
                f"strategy={strategy!r}."
            )
        return SocketTransport(ring, context)
    timeout = None if state is None else state.collective_timeout
    return CollectiveTransport(context, options, timeout, nccl=nccl)


class SocketTransport:
    """The TCP ring between CPU workers (`communication/ring`), one replica each."""

    fuses = True
    divides = True
    scatters = True

    def __init__(self, ring, context):
        self._ring = ring
        self._replicas = context.num_replicas_in_sync

    @property
    def overlaps(self) -> bool:
        """Whether a ring call can run while the backward pass computes.

        A ring call is a synchronous `tf.numpy_function`: it holds the inter-op
        thread that runs it, so it overlaps the backward pass only where every
        worker runs its ops on more than one; the workers agree on it when the
        ring opens (docs/communication.md, "Overlap").
        """
        return self._ring.overlaps

    def all_reduce(self, values, divide_by=None) -> list[tf.Tensor]:
        shapes = [v.shape for v in values]
        if divide_by is None:
            return ring_call(self._ring.all_reduce, values, shapes, "all_reduce")
        ring = self._ring

        def divided(total, *arrays):
            return ring.all_reduce(*arrays, divide_by=total)

        return ring_call(divided, values, shapes, "all_reduce", extra=[divide_by])

    def all_reduce_counted(self, values, counts) -> tuple[list, list]:
        """`all_reduce(values, divide_by=sum of counts[0])` and the summed counts.

        The float32 `counts` ride in the same ring call (`SocketRing.all_reduce`),
        not one of their own before it (issue 36).

        Returns:
            `(divided sums, summed counts)`: lists in the order given.
        """
        ring, counts = self._ring, tf.stack([tf.cast(c, tf.float32) for c in counts])

        def counted(*arrays):
            return ring.all_reduce(*arrays[:-1], counts=arrays[-1])

        shapes = [v.shape for v in values] + [counts.shape]
        *sums, total = ring_call(counted, [*values, counts], shapes, "all_reduce")
        return sums, tf.unstack(total)

    def reduce_scatter(self, matrix) -> tf.Tensor:
        _, columns = matrix.shape
        (row,) = ring_call(
            self._ring.reduce_scatter,
            [tf.reshape(matrix, [-1])],
            [tf.TensorShape([columns])],
            "reduce_scatter",
        )
        return row

    def all_gather(self, row) -> tf.Tensor:
        (columns,) = row.shape
        (flat,) = ring_call(
            self._ring.all_gather,
            [row],
            [tf.TensorShape([self._replicas * columns])],
            "all_gather",
        )
        return tf.reshape(flat, [self._replicas, columns])


class CollectiveTransport:
    """TensorFlow's collectives, or the hierarchical sums over sub-groups."""

    fuses = False
    divides = False
    scatters = False
    overlaps = True  # collectives run on their own threads, not the executor's

    def __init__(
        self,
        context,
        options: AllReduceOptions,
        timeout=None,
        *,
        nccl: bool = False,
    ):
        self._context = context
        self._nccl = nccl
        self._hierarchy = options.hierarchy
        self._group_size = options.group_size
        self._timeout = timeout

    def _sum(self, value):
        if self._hierarchy is not None:
            return _hierarchy.sum_over_replicas(
                value, self._hierarchy, self._group_size, self._timeout
            )
        return self._context.all_reduce(tf.distribute.ReduceOp.SUM, value)

    def all_reduce(self, values, divide_by=None) -> list[tf.Tensor]:
        if divide_by is not None:  # pragma: no cover - callers check `divides`
            raise ValueError("TensorFlow's collectives cannot divide in transit.")
        return [self._sum(value) for value in values]

    def reduce_scatter(self, matrix) -> tf.Tensor:
        """This replica's row of the sum: NCCL's reduce-scatter on GPUs.

        Elsewhere, or under a hierarchy, an all-reduce and this replica's row:
        correct, no saving of bytes.
        """
        if self._hierarchy is None and self._nccl:
            return _hierarchy.reduce_scatter_over_replicas(matrix, self._timeout)
        summed = self._sum(tf.reshape(matrix, [-1]))
        replica = self._context.replica_id_in_sync_group
        return tf.gather(tf.reshape(summed, matrix.shape), replica)

    def all_gather(self, row) -> tf.Tensor:
        return self._context.all_gather(row[None, :], axis=0)


def last_ring_call():
    """The outputs of the current graph's last socket-ring call, or None.

    A compiled loop makes the next step's data wait for it: a `tf.while_loop`
    starts an iteration's ops as soon as their inputs are ready, and the ring's
    program-order chaining holds within one iteration only.
    """
    if tf.executing_eagerly():
        return None
    return _LAST_RING_OP.get(tf.compat.v1.get_default_graph())


def ring_call(function, values, shapes, name: str, extra=()) -> list[tf.Tensor]:
    """Runs a socket-ring call on `values` after the graph's previous ring call.

    Every worker traces the same program, so chaining each ring call on the
    previous one makes all workers send the same buffers in the same order.

    No bytes are copied on the way in or out in a traced step (issue 36, checked
    by pointer in `tests/communication/test_transport.py`): `tf.numpy_function`
    hands `function` numpy views of the input tensors' own buffers (TensorFlow's
    `TensorToNdarray` aliases every numeric tensor but a scalar), and adopts the
    64-byte aligned arrays the ring returns. So `function` must not write to its inputs
    nor keep them after returning. `tf.py_function` would copy every output.
    Eagerly (`fit(run_eagerly=True)`), `tf.numpy_function` copies both ways.

    Args:
        function: A `SocketRing` method taking and returning numpy arrays.
        values: The input tensors; the outputs have the same dtypes.
        shapes: The outputs' static shapes.
        name: The op's name after `socket_` (e.g. `"all_reduce"`).
        extra: Inputs passed to `function` before `values`, with no output.
            Defaults to `()`.

    Returns:
        The outputs, one per value.
    """
    eager = tf.executing_eagerly()  # `fit(run_eagerly=True)`: program order
    graph = None if eager else tf.compat.v1.get_default_graph()
    previous = None if eager else _LAST_RING_OP.get(graph)
    with tf.control_dependencies([previous] if previous is not None else []):
        results = tf.numpy_function(
            function,
            list(extra) + list(values),
            [v.dtype for v in values],
            name=f"socket_{name}",
        )
    # Eagerly, one output comes back as a tensor, not a list of one.
    if not isinstance(results, (list, tuple)):
        results = [results]
    for result, shape in zip(results, shapes):
        result.set_shape(shape)
    if not eager:
        _LAST_RING_OP[graph] = results[0]
    return list(results)
