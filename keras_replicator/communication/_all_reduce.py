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
3. a bucket is summed by the strategy's one transport object (`_transport`):
   its collectives, a hierarchical all-reduce over native sub-groups with
   `hierarchy=` (`_hierarchy`), or, with `transport="socket"`, our TCP ring.
   Uncompressed, the first bucket carries the sample counts and comes back
   divided by their sum (`Transport.sum_counted`), and every later one is
   divided as it is summed (`Transport.sum_bucket`). `reduce_bucket` is that
   step for one bucket, which the sharded update (`sharding/`) reuses for a
   16-bit wire.

`tf.IndexedSlices` gradients keep TensorFlow's own sparse path (an all-gather,
`Transport.sum_sparse`), uncompressed, and come back with each row once
(`_gradient_form`: the library's own embedding gradients arrive dense unless
their table is large). The exact float32 scalars (sample counts) ride
uncompressed with the first float32 / float64 bucket, or with the first fp16
scale all-reduce, or alone. The step's logs are averaged by the same transport
(`mean_over_replicas`).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from keras_replicator.communication import (
    _buckets,
    _compression,
    _division,
    _gradient_form,
    _strategy_transport,
)
from keras_replicator.communication.options import AllReduceOptions


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
            sample count), as `_division.divide`. Uncompressed, the exact
            scalars ride in the first bucket's call (`Transport.sum_counted`)
            and every bucket comes back divided (on the socket ring, inside the
            ring: `_division`). Defaults to False.

    Returns:
        `(summed_gradients, summed_exact)`: lists in the order given.
    """
    strategy = tf.distribute.get_strategy()
    strategy_options = _strategy_transport.options_of(strategy)
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
    transport = _strategy_transport.transport_for(strategy, options)
    sparse = [i for i, g in enumerate(gradients) if isinstance(g, tf.IndexedSlices)]
    dense = [i for i in range(len(gradients)) if i not in sparse]
    summed: dict = {}
    summed_exact, total = None, None
    divided = set()
    # Float32 / float64 first: their first bucket carries the exact scalars.
    buckets = _buckets.plan_by_dtype(
        [gradients[i] for i in dense], transport.bucket_bytes(options)
    )
    # Uncompressed, every bucket comes back divided by the summed count.
    in_transit = divide_by_exact and options.compression is None
    for bucket in buckets:
        indices = [dense[j] for j in bucket]
        members = [gradients[i] for i in indices]
        if in_transit:
            if total is None:  # the first bucket: the counts ride with it
                reduced, summed_exact = transport.sum_counted(members, pending_exact)
                pending_exact, total = [], summed_exact[0]
            else:
                reduced, _ = transport.sum_bucket(members, divide_by=total)
            summed.update(zip(indices, reduced))
            divided.update(indices)
            continue
        carry = pending_exact if members[0].dtype in _buckets.EXACT_CARRIERS else []
        reduced, carried = reduce_bucket(transport, members, carry, options.compression)
        if carry:
            summed_exact, pending_exact = carried, []
        summed.update(zip(indices, reduced))
    if sparse:
        reduced = transport.sum_sparse([gradients[i] for i in sparse])
        # Each row once, as in the dense sum (`_gradient_form`).
        reduced = [_gradient_form.sum_repeated_rows(r) for r in reduced]
        summed.update(zip(sparse, reduced))
    if pending_exact:  # no bucket carried them
        summed_exact = tf.unstack(transport.sum([tf.stack(pending_exact)])[0])
    results = [summed[i] for i in range(len(gradients))]
    if divide_by_exact:
        results = [
            g if i in divided else _division.divide(g, summed_exact[0])
            for i, g in enumerate(results)
        ]
    return results, list(summed_exact or [])


def mean_over_replicas(values) -> list[tf.Tensor]:
    """The mean over all replicas of float tensors (step logs); in a replica context.

    Every replica gets the same bits, through the strategy's transport
    (`Transport.mean`): one ring call on the socket ring, else TensorFlow's
    batched MEAN all-reduce, one per dtype.

    Args:
        values: Float tensors of any shapes and float dtypes.

    Returns:
        The means, in the order and dtypes given.
    """
    transport = _strategy_transport.transport_for(tf.distribute.get_strategy())
    return transport.mean([tf.convert_to_tensor(v) for v in values])


def reduce_bucket(transport, members, exact, compression=None):
    """Sums one bucket of same-dtype tensors over `transport`.

    Args:
        transport: A `_transport.Transport`.
        members: The bucket's dense tensors (one dtype).
        exact: Float32 scalars to sum exactly alongside (may be empty).
        compression: The wire format (`AllReduceOptions.compression`). Defaults
            to `None`.

    Returns:
        `(summed members, summed exact)`.
    """
    dtype = members[0].dtype
    if not _compression.compresses(compression, dtype):
        return transport.sum_bucket(list(members), exact)

    def sum_flat(value):
        return transport.sum([value])[0]

    flat = _buckets.flatten(members)
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
