"""Which worker this process is: its index and whether it is the chief."""

from __future__ import annotations

import tensorflow as tf


def worker_index(strategy=None) -> int:
    """This worker's task index in its cluster (0 outside a cluster).

    Args:
        strategy: A `tf.distribute.Strategy`. Defaults to `None`: the current one.
    """
    strategy = strategy or tf.distribute.get_strategy()
    resolver = getattr(strategy, "cluster_resolver", None)
    task_id = getattr(resolver, "task_id", None)
    return int(task_id) if task_id is not None else 0


def is_chief(strategy=None) -> bool:
    """Whether this worker is the chief: the one that prints, logs and checkpoints.

    The chief is the `chief` task when the cluster has one, else worker 0; a
    single-process strategy is always the chief.

    Args:
        strategy: A `tf.distribute.Strategy`. Defaults to `None`: the current one.

    Example:
    >>> import keras_replicator as kr
    >>> kr.is_chief()
    True
    """
    strategy = strategy or tf.distribute.get_strategy()
    return bool(strategy.extended.should_checkpoint)
