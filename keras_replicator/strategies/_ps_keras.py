"""Installs the Keras 3 routing for `ParameterServerReplicator` (see `_compat`)."""

from __future__ import annotations

from keras_replicator import _compat
from keras_replicator.strategies import _ps_training


class ParameterServerHooks:
    """What `_compat.install_parameter_server`'s patches ask."""

    @staticmethod
    def routes(model) -> bool:
        from keras_replicator.strategies.parameter_server import is_parameter_server

        return is_parameter_server(model.distribute_strategy)

    fit = staticmethod(_ps_training.fit)
    evaluate = staticmethod(_ps_training.evaluate)
    predict = staticmethod(_ps_training.predict)


def install() -> None:
    """Routes `fit` / `evaluate` / `predict` of PS-strategy models (once)."""
    _compat.install_parameter_server(ParameterServerHooks)
