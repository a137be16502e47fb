"""How our strategies move gradients between replicas: the communication layer.

Every gradient all-reduce of a Replicator strategy (the sample-weighted mean of
`fit` / `run_steps` / `wrap_optimizer`, and the stock-contract sum of a plain
`strategy.run` loop, see `_gradients`) ends in `all_reduce_sum`. What it does
with the bytes (packing, bucketing, compression, hierarchy) is this module's
concern alone; the reduction rule (what is summed, what it is divided by) is
`_gradients`'.
"""

from __future__ import annotations

import tensorflow as tf


def all_reduce_sum(gradients, exact=()):
    """Sums tensors over all replicas; call in a replica context.

    Args:
        gradients: A list of dense tensors or `tf.IndexedSlices` (no `None`), of
            any floating dtypes. May be sent in reduced precision when the
            strategy's options ask for compression.
        exact: Float32 scalars (sample counts) that must be summed exactly, never
            compressed. Defaults to `()`.

    Returns:
        `(summed_gradients, summed_exact)`: lists in the order given.
    """
    context = tf.distribute.get_replica_context()
    gradients = list(gradients)
    exact = list(exact)
    # One all-reduce per gradient dtype (TF packs a list into one buffer, which needs
    # a single dtype); the exact scalars ride with float32 or float64 gradients,
    # where they stay exact, or go alone.
    groups: dict = {}
    for i, grad in enumerate(gradients):
        groups.setdefault(_dtype(grad), []).append(i)
    carrier = next((d for d in (tf.float32, tf.float64) if d in groups), None)
    summed: dict = {}
    summed_exact = None
    for dtype, indices in groups.items():
        values = [gradients[i] for i in indices]
        if exact and dtype == carrier:
            values += [tf.cast(e, dtype) for e in exact]
        reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, values)
        if exact and dtype == carrier:
            summed_exact = [tf.cast(r, tf.float32) for r in reduced[len(indices) :]]
            reduced = reduced[: len(indices)]
        summed.update(zip(indices, reduced))
    if exact and summed_exact is None:
        summed_exact = context.all_reduce(tf.distribute.ReduceOp.SUM, exact)
    return [summed[i] for i in range(len(gradients))], list(summed_exact or [])


def _dtype(grad):
    return grad.values.dtype if isinstance(grad, tf.IndexedSlices) else grad.dtype
