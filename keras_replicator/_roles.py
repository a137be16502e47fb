"""Which worker this process is: its index and whether it is the chief."""

from __future__ import annotations

import tensorflow as tf


def worker_index(strategy=None) -> int:
    """This worker's task index in its cluster (0 outside a cluster).

    Args:
        strategy: A `tf.distribute.Strategy`. Defaults to `None`: the current one.
    """
    strategy = strategy or tf.distribute.get_strategy()
    stated = _stated_index(strategy)
    if stated is not None:
        return stated
    resolver = getattr(strategy, "cluster_resolver", None)
    task_id = getattr(resolver, "task_id", None)
    return int(task_id) if task_id is not None else 0


def is_chief(strategy=None) -> bool:
    """Whether this worker is the chief: the one that prints, logs and checkpoints.

    The chief is the `chief` task when the cluster has one, else worker 0; a
    single-process strategy is always the chief. A `ModelParallelReplicator`
    whose mesh spans workers names its own: DTensor client 0.

    Args:
        strategy: A `tf.distribute.Strategy`. Defaults to `None`: the current one.

    Example:
    >>> import keras_replicator as kr
    >>> kr.is_chief()
    True
    """
    strategy = strategy or tf.distribute.get_strategy()
    stated = _stated_index(strategy)
    if stated is not None:
        return stated == 0
    return bool(strategy.extended.should_checkpoint)


def mesh_spans_workers(strategy) -> bool:
    """Whether `strategy` is a device mesh over several worker processes.

    A `ModelParallelReplicator` in a multi-worker run: one DTensor program whose
    collectives cross the workers, none of `tf.distribute`'s (it is one replica
    and one "chief" to TensorFlow). Its files are routed as a multi-worker
    Replicator's (`_files/worker_files.py`).
    """
    return _stated_index(strategy) is not None and strategy.num_workers > 1


def _stated_index(strategy) -> int | None:
    """The worker index a strategy states itself, or None (TensorFlow's own).

    `ModelParallelReplicator` states `worker_index` (its DTensor client id) and
    `num_workers`: to TensorFlow it is a `OneDeviceStrategy`, whose
    `should_checkpoint` is True in every worker. No TensorFlow strategy has a
    `worker_index`.
    """
    index = getattr(strategy, "worker_index", None)
    return None if index is None else int(index)
