"""How the library recognises a `ParameterServerReplicator` without importing it.

`strategies/parameter_server.py` registers its `ReplicatorState` with
`is_parameter_server=True` (`keras_replicator._replicator_state`); `_keras.py` asks
it to decide which models to route. Asking the state instead of an `isinstance`
check keeps this package below `strategies/` (no import cycle).
"""

from __future__ import annotations

from keras_replicator._replicator_state import replicator_state


def is_parameter_server(strategy) -> bool:
    """Whether `strategy` is a `ParameterServerReplicator`."""
    state = replicator_state(strategy)
    return state is not None and state.is_parameter_server
