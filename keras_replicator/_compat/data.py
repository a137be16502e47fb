"""tf.data / distributed-dataset internals Keras reads: the epoch length.

See `_patch_distributed_dataset_length` for why.
"""

from __future__ import annotations

import inspect

import tensorflow as tf

from keras_replicator._compat._patching import replace_property_getter, unpatched
from keras_replicator._compat.strategy import in_multi_worker_mode, is_replicator


def check_upstream() -> dict[str, str]:
    """{name: what changed} for the dataset internals read here."""
    changed = {}
    from keras.src.trainers.data_adapters import tf_dataset_adapter

    length = inspect.getsource(
        unpatched(tf_dataset_adapter.TFDatasetAdapter.num_batches.fget)
    )
    if "self._dataset.cardinality" not in length:
        changed["TFDatasetAdapter.num_batches"] = "no longer reads cardinality"
    from tensorflow.python.distribute import input_lib

    if "self._strategy = strategy" not in inspect.getsource(input_lib):
        changed["input_lib DistributedDataset._strategy"] = "attribute renamed"
    return changed


def install(hooks) -> None:
    """Makes a distributed dataset's length unknown to Keras across workers."""
    del hooks  # Nothing to ask: the answer only depends on the strategy.
    _patch_distributed_dataset_length()


def _patch_distributed_dataset_length():
    # A distributed dataset's `cardinality` is this worker's count of batches. Keras
    # takes it as the epoch length, so with unequal worker shards the workers stop
    # after different numbers of steps and their collectives mismatch ("Collective
    # instance ... expected data_type 9 but got data_type 1"). Across workers the
    # length is unknown to Keras; the iterator's end is synchronised across workers
    # (TF pads exhausted workers with empty batches), so iterate until it.
    from keras.src.trainers.data_adapters import tf_dataset_adapter

    def unknown_across_workers(original):
        def num_batches(self):
            dataset = self._dataset
            if isinstance(dataset, tf.distribute.DistributedDataset):
                strategy = getattr(dataset, "_strategy", None)
                if is_replicator(strategy) and in_multi_worker_mode(strategy):
                    return None
            return original(self)

        return num_batches

    replace_property_getter(
        tf_dataset_adapter.TFDatasetAdapter, "num_batches", unknown_across_workers
    )
