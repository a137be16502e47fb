"""How our strategies move gradients between replicas: the communication layer.

Every gradient all-reduce of a Replicator strategy (the sample-weighted mean of
`fit` / `run_steps` / `wrap_optimizer`, and the stock-contract sum of a plain
`strategy.run` loop, see `_reduction`) ends in `all_reduce_sum`. What it does
with the bytes is this module's concern alone; the reduction rule (what is
summed, what it is divided by) is `_reduction`'s.

The bytes follow the strategy's `kr.AllReduceOptions` (a stock strategy, e.g. a
`tf.distribute.MirroredStrategy` under `kr.wrap_optimizer`, gets the defaults):

1. dense gradients are grouped by dtype and fused into buckets in reverse layer
   order (`_buckets`), one collective per bucket (a flat buffer; the socket ring
   reads the tensors directly), so a bucket can travel while the backward pass
   is still producing earlier layers';
2. a bucket may be cast to 16 bits for the wire (`_compression`);
3. a bucket is summed by the strategy's transport (`_transport`): its
   collectives, a hierarchical all-reduce over native sub-groups with
   `hierarchy=` (`_hierarchy`), or, with `transport="socket"`, our TCP ring.
   `reduce_bucket` is that step for one bucket, which the sharded update
   (`sharding/`) reuses for a 16-bit wire.

`tf.IndexedSlices` gradients keep TensorFlow's own sparse path (an all-gather),
uncompressed, and come back with each row once (`_gradient_form`: the library's
own embedding gradients arrive dense unless their table is large). The exact
float32 scalars (sample counts) ride uncompressed with the first float32 / float64
bucket, or with the first fp16 scale all-reduce, or alone.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from keras_replicator._replicator_state import replicator_state
from keras_replicator.communication import (
    _buckets,
    _compression,
    _division,
    _gradient_form,
    _transport,
)
from keras_replicator.communication.options import AllReduceOptions


def options_of(strategy) -> AllReduceOptions:
    """The strategy's all-reduce options; defaults for stock strategies."""
    state = replicator_state(strategy)
    if state is None or state.options is None:
        return AllReduceOptions()
    return state.options


def all_reduce_sum(
    gradients,
    exact=(),
    options: AllReduceOptions | None = None,
    divide_by_exact: bool = False,
):
    """Sums tensors over all replicas; call in a replica context.

    Args:
        gradients: A list of dense tensors or `tf.IndexedSlices` (no `None`), of
            any floating dtypes. May be sent in reduced precision when the
            options ask for compression.
        exact: Float32 scalars (sample counts) that must be summed exactly, never
            compressed. Defaults to `()`.
        options: Overrides the current strategy's `AllReduceOptions`; a
            `transport` of `None` there means the strategy's transport. Defaults
            to `None`.
        divide_by_exact: Return the sums divided by the summed `exact[0]` (the
            sample count), as `_division.divide`. On the socket ring the exact
            scalars then ride in the first float32 / float64 bucket's call, which
            returns their sums, and each bucket divides inside the ring
            (`_division`); alone, before any bucket, if there is no such bucket.
            Defaults to False.

    Returns:
        `(summed_gradients, summed_exact)`: lists in the order given.
    """
    context = tf.distribute.get_replica_context()
    strategy = tf.distribute.get_strategy()
    strategy_options = options_of(strategy)
    if options is None:
        options = strategy_options
    elif options.transport is None:  # the strategy's, unless rows are given
        # A `hierarchy` without `group_size` on the socket ring: its rows and
        # columns (opened where the machines form a grid).
        grouped = options.hierarchy is not None and options.group_size is not None
        transport = "collective" if grouped else strategy_options.transport
        options = dataclasses.replace(options, transport=transport)
    gradients = list(gradients)
    pending_exact = [tf.cast(e, tf.float32) for e in exact]
    if divide_by_exact and not pending_exact:
        raise ValueError(
            "`divide_by_exact=True` divides by the summed `exact[0]`, so `exact` "
            f"needs a value. Received: exact={exact!r}."
        )
    transport = _transport.transport_for(strategy, options, context)
    sparse = [i for i, g in enumerate(gradients) if isinstance(g, tf.IndexedSlices)]
    dense = [i for i in range(len(gradients)) if i not in sparse]
    summed: dict = {}
    summed_exact, total = None, None
    divided = set()
    # Float32 / float64 first: their first bucket carries the exact scalars.
    buckets = _buckets.plan_by_dtype(
        [gradients[i] for i in dense], bucket_bytes(options, transport)
    )
    counted = divide_by_exact and transport.divides and options.compression is None
    first_dtype = gradients[dense[buckets[0][0]]].dtype if buckets else None
    if counted and first_dtype not in _division.FUSED_DTYPES:
        # No bucket the transport divides: the count first, alone (a few bytes).
        summed_exact = tf.unstack(transport.all_reduce([tf.stack(pending_exact)])[0])
        pending_exact, total, counted = [], summed_exact[0], False
    for bucket in buckets:
        indices = [dense[j] for j in bucket]
        members = [gradients[i] for i in indices]
        dtype = members[0].dtype
        if counted:  # the first bucket: the count rides, every bucket divides
            reduced, summed_exact = transport.all_reduce_counted(members, pending_exact)
            pending_exact, total, counted = [], summed_exact[0], False
            summed.update(zip(indices, reduced))
            divided.update(indices)
            continue
        carry = pending_exact if dtype in _buckets.EXACT_CARRIERS else []
        fused = total if dtype in _division.FUSED_DTYPES else None
        reduced, carried = reduce_bucket(
            transport, members, carry, options.compression, fused
        )
        if carry:
            summed_exact, pending_exact = carried, []
        summed.update(zip(indices, reduced))
        if fused is not None:
            divided.update(indices)
    # TensorFlow's own paths: the sparse all-gather, and scalars no bucket carried.
    if sparse:
        reduced = context.all_reduce(
            tf.distribute.ReduceOp.SUM, [gradients[i] for i in sparse]
        )
        # Each row once, as in the dense sum (`_gradient_form`).
        reduced = [_gradient_form.sum_repeated_rows(r) for r in reduced]
        summed.update(zip(sparse, reduced))
    if pending_exact:
        summed_exact = context.all_reduce(tf.distribute.ReduceOp.SUM, pending_exact)
    results = [summed[i] for i in range(len(gradients))]
    if divide_by_exact:
        results = [
            g if i in divided else _division.divide(g, summed_exact[0])
            for i, g in enumerate(results)
        ]
    return results, list(summed_exact or [])


# The default bucket where a transport's calls cannot overlap the backward pass:
# every bucket of a smaller model in one call; a cap keeps the socket ring's
# shared memory bounded (a chunk of a bucket at most) for large ones.
UNOVERLAPPED_BUCKET_MB = 64.0


def bucket_bytes(options: AllReduceOptions, transport: _transport.Transport) -> float:
    """The bucket capacity for the gradient all-reduce on `transport`.

    Buckets exist so that a bucket travels while earlier layers are still being
    differentiated. Where the transport's calls cannot overlap the backward pass
    (the socket ring on workers with one inter-op thread), more buckets only add
    calls, each a point where the workers wait for each other (issue 36: one
    call beat 16 MB buckets in 19 of 24 paired rounds on 2 workers,
    docs/performance.md). So there the default (`bucket_mb=None`) without
    compression is `UNOVERLAPPED_BUCKET_MB`; an explicit `bucket_mb` is always
    kept, and so are 16 MB buckets under compression (fp16 scales per bucket).

    Args:
        options: The all-reduce options.
        transport: The transport the buckets travel on.

    Returns:
        The capacity in bytes for `_buckets.plan_by_dtype` (0: one per dtype).

    Example:
    >>> class Blocking:
    ...     overlaps = False
    >>> bucket_bytes(AllReduceOptions(), Blocking()) / 1e6
    64.0
    >>> bucket_bytes(AllReduceOptions(bucket_mb=4), Blocking()) / 1e6
    4.0
    """
    default = options.bucket_mb is None and options.compression is None
    if default and not transport.overlaps:
        return UNOVERLAPPED_BUCKET_MB * 1e6
    return options.resolved_bucket_bytes()


def mean_over_replicas(values) -> list[tf.Tensor]:
    """The mean over all replicas of float tensors (step logs); in a replica context.

    Every replica gets the same bits. On the socket ring it is one ring call,
    chained after the step's gradient buckets like any ring call, instead of a
    gRPC collective at the tail of the step with nothing left to overlap (issue
    36). The values travel as float64, whatever their dtypes (one call), and each
    sum is rounded back to its value's dtype before the division by the number of
    replicas in that dtype, the division of TensorFlow's MEAN. With two workers the
    bits are the collectives': float64 holds the exact sum of two float32 (or
    16-bit) values before the one rounding (53 >= 2 * 24 + 2 bits: the double
    rounding is innocuous); with more, a sum may differ from TensorFlow's in the
    last bit (the order of additions differs too). Elsewhere, TensorFlow's
    batched MEAN all-reduce, one per dtype (its batch concatenates the values).

    Args:
        values: Float tensors of any shapes and float dtypes.

    Returns:
        The means, in the order and dtypes given.
    """
    context = tf.distribute.get_replica_context()
    strategy = tf.distribute.get_strategy()
    options = options_of(strategy)
    values = [tf.convert_to_tensor(v) for v in values]
    if options.transport == "socket":
        transport = _transport.transport_for(strategy, options, context)
        with tf.control_dependencies(_ops_that_may_hold_ring_calls()):
            sums = transport.all_reduce([tf.cast(v, tf.float64) for v in values])
        replicas = context.num_replicas_in_sync
        return [
            tf.cast(s, v.dtype) / tf.cast(replicas, v.dtype)
            for s, v in zip(sums, values)
        ]
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


# Where an earlier ring call of the step may sit: its own op, or control flow or a
# function call around it (Keras' gradient accumulation applies in a `tf.cond`).
_RING_CALL_HOLDERS = frozenset(
    {"PyFunc", "EagerPyFunc", "If", "Case", "While", "StatefulPartitionedCall"}
)


def _ops_that_may_hold_ring_calls() -> list:
    """The current graph's ops that may run a ring call (none eagerly).

    `_transport.ring_call` chains a graph's own ring calls in program order, but a
    call inside a `tf.cond` branch is not in its graph's chain: the logs' call,
    which comes after every other of the step, waits for these ops too.
    """
    if tf.executing_eagerly():
        return []
    graph = tf.compat.v1.get_default_graph()
    return [op for op in graph.get_operations() if op.type in _RING_CALL_HOLDERS]


def reduce_bucket(transport, members, exact, compression=None, total=None):
    """Sums one bucket of same-dtype tensors over `transport`.

    Args:
        transport: A `_transport.Transport`.
        members: The bucket's dense tensors (one dtype).
        exact: Float32 scalars to sum exactly alongside (may be empty).
        compression: The wire format (`AllReduceOptions.compression`). Defaults
            to `None`.
        total: Divide the sums by it inside the transport (only where it
            `divides`, uncompressed). Defaults to `None`.

    Returns:
        `(summed members, summed exact)`.
    """
    dtype = members[0].dtype
    if total is not None:
        return transport.all_reduce(list(members), divide_by=total), []
    if transport.fuses and not _compression.compresses(compression, dtype):
        # The transport reads the tensors and writes the sums directly: no flat copy.
        extra = [tf.cast(tf.stack(exact), dtype)] if exact else []
        summed = transport.all_reduce(list(members) + extra)
        if exact:
            return summed[:-1], tf.unstack(tf.cast(summed[-1], tf.float32))
        return summed, []

    def sum_flat(value):
        return transport.all_reduce([value])[0]

    flat = _buckets.flatten(members)
    if not _compression.compresses(compression, dtype):
        if exact:
            flat = tf.concat([flat, tf.cast(tf.stack(exact), dtype)], axis=0)
        flat = sum_flat(flat)
        summed_exact = []
        if exact:
            summed_exact = tf.unstack(tf.cast(flat[-len(exact) :], tf.float32))
            flat = flat[: -len(exact)]
        return _buckets.unflatten(flat, members), summed_exact
    scale = None
    summed_exact = []
    if _compression.needs_scale(compression):
        head = sum_flat(tf.stack([_compression.local_max_abs(flat), *exact]))
        scale = _compression.scale_for(head[0])
        summed_exact = tf.unstack(head[1:]) if exact else []
    elif exact:
        summed_exact = tf.unstack(sum_flat(tf.stack(exact)))
    wire = sum_flat(_compression.encode(flat, compression, scale))
    flat = _compression.decode(wire, dtype, scale)
    return _buckets.unflatten(flat, members), summed_exact
