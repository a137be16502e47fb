"""The metrics' state of an interrupted epoch, kept in a mid-epoch backup.

A backup made in the middle of an epoch (a preemption, an integer `save_freq`)
resumes there; without the metrics' state the resumed epoch's logs would cover
the batches after the resume only. Keras metrics keep sums (totals, counts,
confusion counts), mirrored per replica as sum-aggregated sync-on-read
variables, so reading one in cross-replica context gives the sum over every
replica and worker: the state one device would hold. That state is written
into the backup's metadata (JSON keeps float64 exactly) and, after `fit` reset
the metrics at the start of the resumed epoch, split evenly over the replicas
of the run that resumes, on however many workers: the sums, and so the epoch's
logs, are the uninterrupted run's. A variable aggregated otherwise ("mean",
"only_first_replica") gets the whole value on every replica.

Hand-written: Keras' `BackupAndRestore` keeps no metric state (it resumes at
epoch boundaries, where `fit` resets the metrics anyway).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_replicator._roles import is_chief


def metric_state(model) -> list:
    """`[[path, dtype, values], ...]` of every metric variable, summed over replicas.

    Call on every worker: reading a variable may be a collective.

    Example:
    >>> import keras
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> [path for path, _, _ in metric_state(model)]
    ['loss/total', 'loss/count']
    """
    state = []
    for variable in model.metrics_variables:
        value = np.asarray(variable.numpy())
        state.append([variable.path, str(value.dtype), value.tolist()])
    return state


def restore_metric_state(model, state: list) -> bool:
    """Puts `state` back, split evenly over this run's replicas; whether it did.

    Nothing changes (False) when the metrics are not the ones saved (another
    `compile`): their logs then restart at the resumed batch.
    """
    variables = list(model.metrics_variables)
    saved = [(path, np.asarray(values, dtype)) for path, dtype, values in state]
    if [v.path for v in variables] != [path for path, _ in saved] or any(
        tuple(v.shape) != value.shape for v, (_, value) in zip(variables, saved)
    ):
        return False
    strategy = model.distribute_strategy
    replicas = strategy.num_replicas_in_sync
    for variable, (_, value) in zip(variables, saved):
        # Sums are split; a "mean" or "only_first_replica" variable reads back
        # what every replica holds, so each gets the whole value.
        split = getattr(variable, "aggregation", "sum") == "sum" and (
            np.issubdtype(value.dtype, np.number)
        )
        share = _share(value, replicas) if split else value
        components = strategy.experimental_local_results(variable.value)
        for component in components:
            component.assign(tf.constant(share, dtype=component.dtype))
        if split and np.issubdtype(value.dtype, np.integer):
            # What an integer split leaves over goes to the first replica.
            remainder = value - share * replicas
            if replicas > 1 and is_chief(strategy):
                components[0].assign_add(tf.constant(remainder, components[0].dtype))
    return True


def _share(value: np.ndarray, replicas: int) -> np.ndarray:
    if np.issubdtype(value.dtype, np.integer):
        return value // replicas
    return value / replicas
