"""Small reference models for the demo, notebooks and benchmarks."""

from keras_replicator.models.small_resnet import small_resnet

__all__ = ["small_resnet"]
