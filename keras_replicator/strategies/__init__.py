"""Replicator strategies: stock tf.distribute strategies made correct for Keras 3."""

from keras_replicator._roles import is_chief
from keras_replicator.communication.options import AllReduceOptions
from keras_replicator.keras_integration._wrap_optimizer import wrap_optimizer
from keras_replicator.strategies._auto import auto
from keras_replicator.strategies._devices import devices, split_cpu
from keras_replicator.strategies.model_parallel import ModelParallelReplicator
from keras_replicator.strategies.multi_device import MultiDeviceReplicator
from keras_replicator.strategies.multi_worker import MultiWorkerReplicator
from keras_replicator.strategies.parameter_server import ParameterServerReplicator
from keras_replicator.strategies.tpu import TPUReplicator

__all__ = [
    "AllReduceOptions",
    "ModelParallelReplicator",
    "MultiDeviceReplicator",
    "MultiWorkerReplicator",
    "ParameterServerReplicator",
    "TPUReplicator",
    "auto",
    "devices",
    "is_chief",
    "split_cpu",
    "wrap_optimizer",
]
