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


# Subpackages whose classes Keras files name (`register_keras_serializable`).
_SERIALIZABLE = ("layers", "optimizers", "pipeline", "schedules", "spatial")


def _register_serializable_classes() -> None:
    """Imports the subpackages whose classes `.keras` files name, when Keras is in.

    `keras.models.load_model` finds a class such as `keras_replicator>LARS` only
    once its module ran `register_keras_serializable`, and Keras imports a
    module of its own only for "keras*" packages. With Keras already imported
    (`import keras, keras_replicator as kr`) these imports add only our modules;
    without it (the launcher's parent process) nothing is imported, so `import
    keras_replicator` still starts no TensorFlow. A Keras outside the supported
    range is reported when a strategy is built, not here.
    """
    import sys

    if "keras" not in sys.modules:
        return
    try:
        for name in _SERIALIZABLE:
            importlib.import_module(f"keras_replicator.{name}")
    except (ImportError, RuntimeError):
        return


_register_serializable_classes()
