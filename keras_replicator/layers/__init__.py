"""Layers whose behaviour depends on the replicas they run on."""

from keras_replicator.layers.sync_batch_normalization import SyncBatchNormalization

__all__ = ["SyncBatchNormalization"]
