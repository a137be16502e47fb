"""Exact global-batch metric values, computed inside the training step.

A Keras metric keeps sums (totals, counts) per replica; summing them over every
replica and worker gives exactly the state one device would hold, and
`Metric.stateless_result` turns that state into the value. Doing it inside the
compiled step costs one small fused all-reduce and no extra call into TensorFlow,
where a batch-end callback would launch a separate function every time.

`CrossReplicaMetrics` sets a cadence per model and phase here; the step functions of
`_steps` read it on every call and run the variant with global metrics every
`n`-th call (the same calls on every worker, so collectives stay in order).
"""

from __future__ import annotations

import weakref

import tensorflow as tf

from keras_replicator import replica

_cadences: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def set_cadence(model, phase: str, every_n_steps: int | None) -> None:
    """Makes `phase` ("train" / "test") logs global every `every_n_steps` calls."""
    cadences = _cadences.setdefault(model, {})
    if every_n_steps is None:
        cadences.pop(phase, None)
    else:
        cadences[phase] = [every_n_steps, 0]


def due(model, phase: str) -> bool:
    """Counts one step-function call; True if this one should log global values."""
    entry = _cadences.get(model, {}).get(phase)
    if entry is None:
        return False
    entry[1] += 1
    return entry[1] % entry[0] == 0


def global_results(metrics) -> dict:
    """In a replica: every metric's value over all replicas' summed variables."""
    metrics = [m for m in metrics if m.variables]
    variables = [v for m in metrics for v in m.variables]
    if not variables:
        return {}
    local = [tf.cast(tf.convert_to_tensor(v.value), tf.float32) for v in variables]
    summed = replica.all_reduce(
        tf.concat([tf.reshape(v, [-1]) for v in local], axis=0), "sum"
    )
    totals, offset = [], 0
    for variable, value in zip(variables, local):
        size = value.shape.num_elements()
        part = tf.reshape(summed[offset : offset + size], value.shape)
        offset += size
        totals.append(tf.cast(_aggregate(variable, part, value), variable.dtype))
    results, position = {}, 0
    for metric in metrics:
        count = len(metric.variables)
        result = metric.stateless_result(totals[position : position + count])
        position += count
        if isinstance(result, dict):
            results.update(result)
        else:
            results[metric.name] = result
    return results


def _aggregate(variable, summed, local):
    aggregation = getattr(variable, "aggregation", "sum")
    if aggregation == "mean":
        return summed / tf.cast(replica.num_replicas(), summed.dtype)
    if aggregation in ("none", "only_first_replica"):
        return local
    return summed
