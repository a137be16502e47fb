"""A per-model count of the samples trained on, summed over replicas and workers.

Throughput needs the number of samples each step consumed; Keras does not expose the
batch size to callbacks. Each replica adds its batch size to a sync-on-read variable
inside the step; reading it outside a step sums over all replicas and workers.
"""

from __future__ import annotations

import weakref

import tensorflow as tf

_counters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def counter_for(model) -> tf.Variable:
    """The model's sample counter (created under its strategy on first use)."""
    counter = _counters.get(model)
    if counter is None:
        with model.distribute_strategy.scope():
            counter = tf.Variable(
                0.0,
                dtype=tf.float64,
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
                name="kr_samples_seen",
            )
        _counters[model] = counter
    return counter


def samples_seen(model) -> float | None:
    """Samples trained on so far by all replicas, or None if never counted."""
    counter = _counters.get(model)
    return None if counter is None else float(counter.read_value())
