"""keras_replicator: distributed Keras 3 training that is correct, fast and boring.

Names are imported lazily so that `keras_replicator.launch` (the process runner) can
be used without importing TensorFlow in the parent process.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "AllReduceOptions": "keras_replicator.strategies",
    "ModelParallelReplicator": "keras_replicator.strategies",
    "MultiDeviceReplicator": "keras_replicator.strategies",
    "MultiWorkerReplicator": "keras_replicator.strategies",
    "ParameterServerReplicator": "keras_replicator.strategies",
    "TPUReplicator": "keras_replicator.strategies",
    "auto": "keras_replicator.strategies",
    "devices": "keras_replicator.strategies",
    "is_chief": "keras_replicator.strategies",
    "scaled_learning_rate": "keras_replicator.schedules",
    "split_cpu": "keras_replicator.strategies",
    "wrap_optimizer": "keras_replicator.strategies",
}
_SUBMODULES = (
    "callbacks",
    "data",
    "launch",
    "layers",
    "models",
    "optimizers",
    "pipeline",
    "replica",
    "schedules",
    "spatial",
    "strategies",
    "testing",
)

__all__ = sorted(_LAZY) + list(_SUBMODULES) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"keras_replicator.{name}")
    raise AttributeError(f"module 'keras_replicator' has no attribute {name!r}")


def __dir__():
    return __all__
