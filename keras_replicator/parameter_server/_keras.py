"""Installs the Keras 3 routing for `ParameterServerReplicator` (see `_compat`)."""

from __future__ import annotations

from keras_replicator import _compat
from keras_replicator.parameter_server import _training
from keras_replicator.parameter_server._marker import is_parameter_server


class ParameterServerHooks:
    """What `_compat.install_parameter_server`'s patches ask."""

    @staticmethod
    def routes(model) -> bool:
        return is_parameter_server(model.distribute_strategy)

    fit = staticmethod(_training.fit)
    evaluate = staticmethod(_training.evaluate)
    predict = staticmethod(_training.predict)


def install() -> None:
    """Routes `fit` / `evaluate` / `predict` of PS-strategy models (once)."""
    _compat.install_parameter_server(ParameterServerHooks)
