"""tf.data / distributed-dataset internals: the epoch length, how `fit` is fed.

See `_patch_epoch_iterator` (and the per-iterator `_forget_length`, `_resuming`)
for why;
`worker_dataset` and `dataset_op_types` read what no public API exposes.
"""

from __future__ import annotations

import inspect

import tensorflow as tf

from keras_replicator._compat._patching import changed_digests, replace, unpatched
from keras_replicator._compat.strategy import in_multi_worker_mode, is_replicator

# Source digests of Keras' epoch iterator constructor, which `_patch_epoch_iterator`
# stands in for under our strategies, and of the epoch's enumeration, which
# `_resuming` wraps (keras==3.15.1; the same on 3.14.1).
DIGESTS = {
    "TFEpochIterator.__init__": "901af2700297156f",
    "TFEpochIterator._enumerate_iterator": "376e3e16a928107a",  # EpochIterator's
}


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
    if "self._cloned_datasets.append(" not in inspect.getsource(
        input_lib.DistributedDataset
    ):
        changed["DistributedDataset._cloned_datasets"] = "attribute renamed"
    if not hasattr(tf.data.Dataset, "_as_serialized_graph"):
        changed["Dataset._as_serialized_graph"] = "removed"
    from keras.src.backend.tensorflow import trainer as _tf_trainer

    changed.update(
        changed_digests(
            DIGESTS,
            {
                "TFEpochIterator.__init__": unpatched(
                    _tf_trainer.TFEpochIterator.__init__
                ),
                "TFEpochIterator._enumerate_iterator": unpatched(
                    _tf_trainer.TFEpochIterator._enumerate_iterator
                ),
            },
        )
    )
    return changed


def install(hooks) -> None:
    """Makes a distributed dataset's length unknown to Keras across workers,
    lets `hooks.input_for_fit` choose what Keras' epoch iterator iterates, and
    `hooks.take_resume_batches` where its first epoch starts."""
    _patch_epoch_iterator(hooks)


def worker_dataset(distributed):
    """This worker's dataset inside a `tf.distribute.DistributedDataset`, or None.

    The dataset TF built for this worker's only input device (auto-sharded and
    rebatched, `DistributedDataset._cloned_datasets`; no public accessor): its
    elements are the ones the distributed iterator would hand the one replica.
    None when the worker has several input devices.
    """
    clones = getattr(distributed, "_cloned_datasets", None)
    if clones is None or len(clones) != 1:
        return None
    return clones[0]


def dataset_op_types(dataset) -> set[str]:
    """The op types of `dataset`'s pipeline graph, function bodies included.

    Empty when the graph cannot be serialized (a GraphDef over 2 GB).

    tf.data has no public way to ask what a pipeline reads; its serialized graph
    (`Dataset._as_serialized_graph`, the graph TF's auto-sharding rewrites) says.
    """
    from tensorflow.core.framework import graph_pb2

    try:
        serialized = dataset._as_serialized_graph().numpy()
    except (tf.errors.OpError, ValueError):  # over 2 GB, or unsaveable state
        return set()
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(serialized)
    types = {node.op for node in graph.node}
    for function in graph.library.function:
        types.update(node.op for node in function.node_def)
    return types


def _patch_epoch_iterator(hooks):
    # Keras' `TFEpochIterator` always wraps `fit`'s dataset with
    # `experimental_distribute_dataset`. With one replica per worker the
    # distributed iterator only adds per-step costs (a multi-device iterator with
    # its own threads, a partial-batch `cond`, and across workers an end-of-data
    # all-reduce every step: issue 36). Under our strategies `hooks.input_for_fit`
    # decides what is iterated; the rest is Keras' constructor.
    from keras.src.backend.tensorflow import trainer as _tf_trainer
    from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter
    from keras.src.trainers.epoch_iterator import EpochIterator

    def fed_by_hooks(original):
        def __init__(self, distribute_strategy=None, *args, **kwargs):
            if not is_replicator(distribute_strategy):
                return original(self, distribute_strategy, *args, **kwargs)
            EpochIterator.__init__(self, *args, **kwargs)
            self._distribute_strategy = distribute_strategy
            adapter = self.data_adapter
            if _length_unknown_across_workers(adapter):
                _forget_length(self)
            self._distributed_dataset = hooks.input_for_fit(
                distribute_strategy,
                adapter.get_tf_dataset(),
                self._num_batches,
                may_read_files=isinstance(adapter, TFDatasetAdapter),
            )
            # This iterator's own enumeration (not the class's): see `_resuming`.
            self._enumerate_iterator = _resuming(self, hooks)

        return __init__

    replace(_tf_trainer.TFEpochIterator, "__init__", fed_by_hooks)


def _resuming(iterator, hooks):
    """`iterator`'s epoch enumeration, resuming where a mid-epoch backup was made.

    A mid-epoch backup (a preemption, an integer save_freq) resumes there (issue
    38). Keras' `fit` has an initial epoch but no initial step, so the batches of
    the first epoch that the backup already trained on are read and dropped
    here: the data position stays exact, and the steps (and the callbacks' batch
    numbers) count on from there. Once per resume; set on the epoch iterators
    our strategies build (`_patch_epoch_iterator`), so Keras' class stays its own.
    """
    original = type(iterator)._enumerate_iterator

    def _enumerate_iterator():
        skip = hooks.take_resume_batches(iterator._distribute_strategy)
        for begin_step, end_step, data in original(iterator):
            if end_step < skip:  # trained on before the backup
                try:
                    for _ in range(end_step - begin_step + 1):
                        next(data)
                except (StopIteration, tf.errors.OutOfRangeError):
                    return  # the backup was at the epoch's last batch
                continue
            yield begin_step, end_step, data

    return _enumerate_iterator


def _length_unknown_across_workers(adapter) -> bool:
    """Whether `adapter` reads a dataset distributed by one of our multi-worker
    strategies, whose length Keras must not take from this worker's shard."""
    dataset = getattr(adapter, "_dataset", None)
    if not isinstance(dataset, tf.distribute.DistributedDataset):
        return False
    strategy = getattr(dataset, "_strategy", None)
    return is_replicator(strategy) and in_multi_worker_mode(strategy)


def _forget_length(iterator) -> None:
    """Makes `iterator`'s epoch length unknown, now and after every `reset`.

    A distributed dataset's `cardinality` is this worker's count of batches.
    Keras takes it as the epoch length (`TFDatasetAdapter.num_batches`), so with
    unequal worker shards the workers stop after different numbers of steps and
    their collectives mismatch ("Collective instance ... expected data_type 9 but
    got data_type 1"). Across workers the iterator's end is synchronised (TF pads
    exhausted workers with empty batches), so the epoch runs until it. Set on the
    epoch iterators our strategies build: Keras' adapter class stays its own.
    """
    stock_reset = iterator.reset

    def reset():
        stock_reset()
        iterator._num_batches = None

    iterator._num_batches = None
    iterator.reset = reset
