"""`ReplicaConsistencyCheck`: fail loudly when replicas stop holding the same weights.

Synchronous data parallelism assumes every replica applies the same update to the
same weights. When that silently breaks (a non-deterministic op, a collective that
one replica skipped, a restore on one worker only), results drift from one device's
with no error; it is the first thing to rule out when distributed results differ.

Every `every_n_steps` batches each replica hashes the bits of every mirrored variable
(weights, and optimizer slots unless excluded) and the hashes are all-gathered in one
collective; variables whose hashes differ between replicas are named in the error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_replicator import replica


class ReplicaDivergenceError(RuntimeError):
    """Replicas hold different values of variables that should be identical."""


class ReplicaConsistencyCheck(keras.callbacks.Callback):
    """Checks that all replicas' weights (and optimizer slots) are bit-identical.

    Args:
        every_n_steps: Check every this many training batches. Defaults to `100`.
        include_optimizer: Also check the optimizer's variables. Defaults to
            `True`.
        check_on_epoch_end: Also check at the end of every epoch. Defaults to
            `True`.

    Raises:
        ReplicaDivergenceError: (from `fit`) naming the variables whose values
            differ between replicas, with the replicas that disagree.

    Example:
    >>> import keras_replicator as kr
    >>> check = kr.callbacks.ReplicaConsistencyCheck(every_n_steps=100)
    """

    def __init__(
        self,
        every_n_steps: int = 100,
        include_optimizer: bool = True,
        check_on_epoch_end: bool = True,
    ):
        super().__init__()
        if (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 1
        ):
            raise ValueError(
                "`every_n_steps` must be a positive integer. "
                f"Received: every_n_steps={every_n_steps!r}."
            )
        self.every_n_steps = every_n_steps
        self.include_optimizer = include_optimizer
        self.check_on_epoch_end = check_on_epoch_end
        self._function: Callable[[], Any] | None = None
        self._variables: list | None = None

    def on_train_batch_end(self, batch, logs=None):
        if (batch + 1) % self.every_n_steps == 0:
            self.check()

    def on_epoch_end(self, epoch, logs=None):
        if self.check_on_epoch_end:
            self.check()

    def check(self) -> None:
        """Runs the check now; raises `ReplicaDivergenceError` on a mismatch."""
        variables = self._checked_variables()
        if not variables:
            return
        if self._function is None or self._variables != variables:
            self._function = _hash_function(self.model.distribute_strategy, variables)
            self._variables = variables
        hashes = np.asarray(self._function())  # [replicas, variables]
        diverged = [
            (variable.path, _disagreeing(hashes[:, i]))
            for i, variable in enumerate(variables)
            if len(set(hashes[:, i].tolist())) > 1
        ]
        if diverged:
            lines = "\n".join(
                f"  {path}: replicas {groups}" for path, groups in diverged[:20]
            )
            more = (
                f"\n  ... and {len(diverged) - 20} more" if len(diverged) > 20 else ""
            )
            raise ReplicaDivergenceError(
                f"{len(diverged)} variable(s) differ between replicas (replicas "
                f"grouped by identical value):\n{lines}{more}\nAll replicas must "
                "apply identical updates: look for a replica-dependent update, a "
                "non-deterministic op, or a restore that ran on some workers only."
            )

    def _checked_variables(self):
        variables = list(self.model.weights)
        optimizer = getattr(self.model, "optimizer", None)
        if self.include_optimizer and optimizer is not None:
            variables += list(optimizer.variables)
        if self.model.distribute_strategy.num_replicas_in_sync == 1:
            return []
        return variables

    def get_config(self):
        return {
            "every_n_steps": self.every_n_steps,
            "include_optimizer": self.include_optimizer,
            "check_on_epoch_end": self.check_on_epoch_end,
        }


def _bit_hash(value) -> tf.Tensor:
    """An int64 hash of a tensor's exact bits (position-weighted, wrapping)."""
    value = tf.reshape(tf.convert_to_tensor(value), [-1])
    if value.dtype.is_floating:
        width = {2: tf.int16, 4: tf.int32, 8: tf.int64}[value.dtype.size]
        value = tf.bitcast(value, width)
    value = tf.cast(value, tf.int64)
    positions = tf.range(1, tf.size(value, out_type=tf.int64) + 1, dtype=tf.int64)
    return tf.reduce_sum(value * (positions * 2654435761 % 1000003 + 1))


def _hash_function(strategy, variables):
    def replica_fn():
        hashes = tf.stack([_bit_hash(v.value) for v in variables])
        return replica.all_gather(tf.expand_dims(hashes, 0), axis=0)

    @tf.function
    def hashes():
        return strategy.experimental_local_results(strategy.run(replica_fn))[0]

    return hashes


def _disagreeing(column) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for index, value in enumerate(column.tolist()):
        groups.setdefault(value, []).append(index)
    return list(groups.values())
