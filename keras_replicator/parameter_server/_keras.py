"""Installs the Keras 3 routing for `ParameterServerReplicator` (see `_compat`)."""

from __future__ import annotations

import tensorflow as tf

from keras_replicator import _compat
from keras_replicator._replicator_state import replicator_state
from keras_replicator.parameter_server import _training
from keras_replicator.parameter_server._marker import is_parameter_server


class ParameterServerHooks:
    """What `_compat.install_parameter_server`'s patches ask."""

    @staticmethod
    def routes(model) -> bool:
        return is_parameter_server(model.distribute_strategy)

    @staticmethod
    def atomic_updates() -> bool:
        """True where Keras variable increments must be atomic: PS steps."""
        return tf.distribute.has_strategy() and is_parameter_server(
            tf.distribute.get_strategy()
        )

    @staticmethod
    def check_variable(variable, parts: int) -> None:
        """Refuses a Keras variable a `variable_partitioner` has sharded."""
        if parts > 1 and is_parameter_server(tf.distribute.get_strategy()):
            raise ValueError(_sharded_message(variable, parts))

    fit = staticmethod(_training.fit)
    evaluate = staticmethod(_training.evaluate)
    predict = staticmethod(_training.predict)


def install() -> None:
    """Routes `fit` / `evaluate` / `predict` of PS-strategy models (once)."""
    _compat.install_parameter_server(ParameterServerHooks)


def _sharded_message(variable, parts: int) -> str:
    state = replicator_state(tf.distribute.get_strategy())
    partitioner = type(state.partitioner if state is not None else None).__name__
    return (
        "`variable_partitioner` cannot shard Keras 3 variables: Keras computes "
        "gradients through a variable's single resource handle, which a sharded "
        "variable does not have (the first step would fail with \"'ShardedVariable' "
        "object has no attribute 'handle'\"). Received: "
        f"variable_partitioner={partitioner}(...), which split `{variable.path}` "
        f"(shape {tuple(variable.shape)}) into {parts} parts. Pass "
        "`variable_partitioner=None`: each variable then lives whole on one "
        "parameter server, assigned round-robin, so several ps still share the "
        "model (see docs/async.md)."
    )
