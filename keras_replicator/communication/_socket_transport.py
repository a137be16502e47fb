"""The socket ring as a `Transport` (`MultiWorkerReplicator`, CPU workers).

The ring (`communication/ring`: flat, or rows and columns across machines) is
one replica per worker. A call hands it a list of tensors as one message: the
ring reads them where they lie and writes the sums into fresh aligned arrays
(`ring_call`), so a bucket needs no flat copy. It divides by the summed sample
count between its reduce-scatter and all-gather phases, where each worker holds
`1/N` of the buffer (`_division`), and the counts ride in the bucket's own call
(`sum_counted`, issue 36), not one of their own. Its reduce-scatter and
all-gather are its own phases, `1/N` of an all-reduce's bytes each. The step's
logs (with the preemption agreement) travel as one float64 call after the
gradient buckets (`mean`).

A ring call is a synchronous `tf.numpy_function`: it holds the inter-op thread
that runs it, so it overlaps the backward pass only where every worker runs its
ops on more than one; the workers agree on it when the ring opens
(`SocketRing.overlaps`, docs/communication.md, "Overlap"). Where calls cannot
overlap, more buckets only add calls, each a point where the workers wait for
each other (issue 36: one call beat 16 MB buckets in 19 of 24 paired rounds on
2 workers, docs/performance.md): there the default bucket is
`UNOVERLAPPED_BUCKET_MB`.

Example:
>>> import keras_replicator as kr
>>> class Blocking:  # a ring whose calls hold the only inter-op thread
...     overlaps = False
>>> SocketTransport(Blocking()).bucket_bytes(kr.AllReduceOptions()) / 1e6
64.0
"""

from __future__ import annotations

import dataclasses
import weakref

import tensorflow as tf

from keras_replicator.communication import _division
from keras_replicator.communication._transport import Transport
from keras_replicator.communication.options import AllReduceOptions

# Per graph, the output of its last socket-ring call: the next one waits for it,
# so every worker runs them in the same (program) order.
_LAST_RING_OP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# The default bucket where the ring's calls cannot overlap the backward pass:
# every bucket of a smaller model in one call; a cap keeps the ring's shared
# memory bounded (a chunk of a bucket at most) for large ones.
UNOVERLAPPED_BUCKET_MB = 64.0

# Where an earlier ring call of the step may sit: its own op, or control flow or a
# function call around it (Keras' gradient accumulation applies in a `tf.cond`).
_RING_CALL_HOLDERS = frozenset(
    {"PyFunc", "EagerPyFunc", "If", "Case", "While", "StatefulPartitionedCall"}
)


class SocketTransport(Transport):
    """The TCP ring between CPU workers (`communication/ring`), one replica each.

    Args:
        ring: This worker's `SocketRing` (or `HierarchicalRing`).
        options: The resolved all-reduce options. Defaults to the defaults with
            `transport="socket"`.
        collective_timeout: Seconds the strategy's collectives wait, or None.
            Defaults to `None`.

    Attributes:
        ring: The ring, for what runs outside a replica context
            (`sharding/_saving`).
    """

    def __init__(
        self,
        ring,
        options: AllReduceOptions | None = None,
        collective_timeout: float | None = None,
    ):
        if options is None:
            options = dataclasses.replace(AllReduceOptions(), transport="socket")
        super().__init__(options, collective_timeout)
        self.ring = ring

    def _call(self, function, values, shapes, name: str, extra=()) -> list:
        return ring_call(function, values, shapes, name, extra)

    def sum(self, values) -> list[tf.Tensor]:
        shapes = [v.shape for v in values]
        return self._call(self.ring.all_reduce, list(values), shapes, "all_reduce")

    def sum_bucket(self, members, exact=(), divide_by=None) -> tuple[list, list]:
        dtype = members[0].dtype
        if divide_by is not None:
            if exact:  # pragma: no cover - the counts ride in `sum_counted`
                raise ValueError("A divided bucket carries no exact scalars.")
            if dtype not in _division.FUSED_DTYPES:
                return [_division.divide(s, divide_by) for s in self.sum(members)], []
            ring = self.ring

            def divided(total, *arrays):
                return ring.all_reduce(*arrays, divide_by=total)

            shapes = [v.shape for v in members]
            sums = self._call(
                divided, list(members), shapes, "all_reduce", extra=[divide_by]
            )
            return sums, []
        extra = [tf.cast(tf.stack(exact), dtype)] if exact else []
        summed = self.sum(list(members) + extra)
        if exact:
            return summed[:-1], tf.unstack(tf.cast(summed[-1], tf.float32))
        return summed, []

    def sum_counted(self, members, counts) -> tuple[list, list]:
        """The float32 `counts` ride in the bucket's ring call
        (`SocketRing.all_reduce(..., counts=)`); a 16-bit bucket, which the ring
        does not divide, goes after a call of the counts alone."""
        counts = tf.stack([tf.cast(c, tf.float32) for c in counts])
        if members[0].dtype not in _division.FUSED_DTYPES:
            summed = tf.unstack(self.sum([counts])[0])
            sums, _ = self.sum_bucket(members, divide_by=summed[0])
            return sums, summed
        ring = self.ring

        def counted(*arrays):
            return ring.all_reduce(*arrays[:-1], counts=arrays[-1])

        shapes = [v.shape for v in members] + [counts.shape]
        *sums, total = self._call(counted, [*members, counts], shapes, "all_reduce")
        return sums, tf.unstack(total)

    def mean(self, values) -> list[tf.Tensor]:
        """One ring call, chained after the step's gradient buckets.

        Not a gRPC collective at the tail of the step with nothing left to
        overlap (issue 36). The values travel as float64, whatever their dtypes
        (one call), and each sum is rounded back to its value's dtype before the
        division by the number of replicas in that dtype, the division of
        TensorFlow's MEAN. With two workers the bits are the collectives':
        float64 holds the exact sum of two float32 (or 16-bit) values before the
        one rounding (53 >= 2 * 24 + 2 bits: the double rounding is innocuous);
        with more, a sum may differ from TensorFlow's in the last bit (the order
        of additions differs too).
        """
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        with tf.control_dependencies(_ops_that_may_hold_ring_calls()):
            sums = self.sum([tf.cast(v, tf.float64) for v in values])
        return [
            tf.cast(s, v.dtype) / tf.cast(replicas, v.dtype)
            for s, v in zip(sums, values)
        ]

    def reduce_scatter(self, matrix) -> tf.Tensor:
        _, columns = matrix.shape
        (row,) = self._call(
            self.ring.reduce_scatter,
            [tf.reshape(matrix, [-1])],
            [tf.TensorShape([columns])],
            "reduce_scatter",
        )
        return row

    def all_gather(self, row) -> tf.Tensor:
        (columns,) = row.shape
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        (flat,) = self._call(
            self.ring.all_gather,
            [row],
            [tf.TensorShape([replicas * columns])],
            "all_gather",
        )
        return tf.reshape(flat, [replicas, columns])

    def bucket_bytes(self, options: AllReduceOptions) -> float:
        """`UNOVERLAPPED_BUCKET_MB` where calls cannot overlap and the options
        keep the default (`bucket_mb=None`, no compression: fp16 scales per
        bucket); an explicit `bucket_mb` is always kept."""
        default = options.bucket_mb is None and options.compression is None
        if default and not self.ring.overlaps:
            return UNOVERLAPPED_BUCKET_MB * 1e6
        return options.resolved_bucket_bytes()


def last_ring_call():
    """The output of the current graph's last socket-ring call, or None.

    A compiled loop makes the next step's data wait for it (`keras_integration/
    _loop`): a `tf.while_loop` starts an iteration's ops as soon as their inputs
    are ready, and the ring's program-order chaining holds within one iteration
    only.
    """
    if tf.executing_eagerly():
        return None
    return _LAST_RING_OP.get(tf.compat.v1.get_default_graph())


def _ops_that_may_hold_ring_calls() -> list:
    """The current graph's ops that may run a ring call (none eagerly).

    `ring_call` chains a graph's own ring calls in program order, but a call
    inside a `tf.cond` branch is not in its graph's chain: the logs' call, which
    comes after every other of the step, waits for these ops too.
    """
    if tf.executing_eagerly():
        return []
    graph = tf.compat.v1.get_default_graph()
    return [op for op in graph.get_operations() if op.type in _RING_CALL_HOLDERS]


def ring_call(function, values, shapes, name: str, extra=()) -> list[tf.Tensor]:
    """Runs a socket-ring call on `values` after the graph's previous ring call.

    Every worker traces the same program, so chaining each ring call on the
    previous one makes all workers send the same buffers in the same order.

    No bytes are copied on the way in or out in a traced step (issue 36, checked
    by pointer in `tests/communication/test_socket_transport.py`): `tf.numpy_function`
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
