"""Keras callbacks that behave correctly when training runs on several workers."""

from keras_replicator.callbacks.backup_and_restore import BackupAndRestore
from keras_replicator.callbacks.chief_only import ChiefOnly
from keras_replicator.callbacks.cross_replica_metrics import CrossReplicaMetrics
from keras_replicator.callbacks.input_wait import InputWait
from keras_replicator.callbacks.lr_warmup import LearningRateWarmup
from keras_replicator.callbacks.model_checkpoint import ModelCheckpoint
from keras_replicator.callbacks.replica_consistency_check import (
    ReplicaConsistencyCheck,
    ReplicaDivergenceError,
)
from keras_replicator.callbacks.throughput import Throughput
from keras_replicator.callbacks.trust_ratio_logger import TrustRatioLogger

__all__ = [
    "BackupAndRestore",
    "ChiefOnly",
    "CrossReplicaMetrics",
    "InputWait",
    "LearningRateWarmup",
    "ModelCheckpoint",
    "ReplicaConsistencyCheck",
    "ReplicaDivergenceError",
    "Throughput",
    "TrustRatioLogger",
]
