"""Optimizers for large-batch training: `LARS` (You et al. 2017)."""

from keras_replicator.optimizers.lars import LARS

__all__ = ["LARS"]
