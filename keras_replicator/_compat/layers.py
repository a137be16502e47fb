"""Keras layer internals: the batch-norm `_moments` hook SyncBatchNormalization uses."""

from __future__ import annotations

import inspect

from keras.src.layers.normalization import batch_normalization as _bn_module


def check_upstream() -> dict[str, str]:
    """{name: what changed} for the layer internals read here."""
    bn_call = inspect.getsource(_bn_module.BatchNormalization.call)
    if "self._moments(inputs, mask)" not in bn_call:
        return {"BatchNormalization.call": "no longer calls self._moments"}
    return {}


def register_batch_norm_moments_hook() -> None:
    """Documents (and checks) that SyncBatchNormalization overrides `_moments`.

    Keras' `BatchNormalization.call` asks `self._moments(inputs, mask)` for the
    training moments; no public hook exists, and overriding it keeps Keras' moving
    statistics, masking and mixed-precision handling (keras-team/keras has no
    grouped synchronisation; the TF-only `synchronized=True` uses all replicas).
    """
    source = inspect.getsource(_bn_module.BatchNormalization.call)
    if "self._moments(inputs, mask)" not in source:
        raise ImportError(
            "keras.layers.BatchNormalization.call no longer calls "
            "`self._moments(inputs, mask)`; update "
            "keras_replicator/layers/sync_batch_normalization.py."
        )
