"""How the library recognises a `ParameterServerReplicator` without importing it.

`strategies/parameter_server.py` sets the marker; `_keras.py` reads it to decide which
models to route. Reading an attribute instead of an `isinstance` check keeps this
package below `strategies/` (no import cycle).
"""

from __future__ import annotations

PS_MARKER = "_kr_is_parameter_server"


def is_parameter_server(strategy) -> bool:
    """Whether `strategy` is a `ParameterServerReplicator`."""
    return getattr(strategy, PS_MARKER, False)
