"""What Keras' `fit` / `evaluate` / `predict` iterate under our strategies.

Keras wraps every dataset with `strategy.experimental_distribute_dataset`. With
one replica per worker the distributed iterator does nothing the replica needs,
and costs on every step: a multi-device iterator with its own prefetch threads
and function calls, a partial-batch `tf.cond` in front of the step's data, and
across workers an all-reduce of "who still has data" before every step (issue
36). A plain `tf.data` step has none of that. So, one replica per worker:

- one worker (`kr.MultiDeviceReplicator(num_replicas=1)`, `kr.auto()` on one
  device): the dataset itself, exactly what plain Keras iterates;
- several workers: this worker's part of TF's distributed dataset (the same
  auto-sharded, rebatched dataset the distributed iterator reads, so the same
  batches in the same order), iterated plainly, when every worker is known to
  get the same number of batches. TF's rebatching gives every worker one
  (possibly empty) batch per global batch under `DATA` sharding, and under `AUTO`
  when the pipeline reads no files (auto-sharding then falls back to `DATA`).
  The global length must also be known (or infinite; Keras knows it for
  arrays), so a pipeline whose length could differ between workers (an unseeded
  `filter`) is not trusted; that also rules out the tf.data service, whose
  length is unknown. Otherwise (`OFF`, which says the pipeline shards itself by
  hand; file sharding; `HINT`; an unknown length) the workers may run out of
  data at different steps, and TF's distributed iterator,
  which pads the exhausted ones, stays.

On a GPU the distributed iterator also copied each batch to the replica's device
ahead of the step (a multi-device iterator prefetches to its devices). The plain
feed keeps that: on GPUs (`_platform.platform_of`) the dataset ends with
`tf.data.experimental.copy_to_device(replica device)` and a one-batch `prefetch`
(what `prefetch_to_device` builds, from this worker's host), so batch i + 1 is
copied host -> GPU while step i runs, instead of synchronously inside the step;
one batch on the device, as TF's distributed iterator buffers by default
(`tf.distribute.InputOptions.experimental_per_replica_buffer_size`). On CPU the
dataset is unchanged: the replica reads host memory.

Several replicas on a worker, a `tf.distribute.DistributedDataset` the user made,
and TPUs keep the distributed iterator (which fetches to the devices itself).
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator import _compat, _platform

# Source datasets that make `AUTO` shard by files (TF's auto-shard rewrite looks
# for these), and the tf.data service's reader: with them, worker counts may differ.
_FILE_SOURCES = (
    "ArrayRecordDataset",
    "FixedLengthRecordDataset",
    "RecordIODataset",
    "SSTableDataset",
    "TextLineDataset",
    "TFRecordDataset",
)  # prefixes: TF matches every version of these ops (`TFRecordDatasetV2`, ...)
_SERVICE_PREFIX = "DataServiceDataset"
_POLICY = tf.data.experimental.AutoShardPolicy
# Batches held on the GPU ahead of the step: TF's distributed iterator's default.
DEVICE_BUFFER_BATCHES = 1
# Dtypes that live in host memory on a GPU (TF keeps them there).
_HOST_DTYPES = (tf.string, tf.resource, tf.variant)


def input_for_fit(strategy, dataset, num_batches=None, may_read_files=True):
    """The dataset (or distributed dataset) Keras' epoch iterator should iterate.

    Args:
        strategy: The model's strategy (one of ours).
        dataset: What Keras' data adapter made of the user's input: a
            `tf.data.Dataset`, or the user's own distributed dataset.
        num_batches: The epoch's length as Keras' data adapter knows it (arrays:
            always, though their dataset's `cardinality()` is unknown), or None.
        may_read_files: False when Keras built `dataset` itself (from arrays, a
            generator, a `PyDataset`): it reads no files, so its graph is not
            inspected (serializing it would copy every array it holds).

    Returns:
        `dataset` or this worker's part of it when one replica per worker may be
        fed plainly (see the module docstring), prefetched to the replica's GPU
        on GPUs, else
        `strategy.experimental_distribute_dataset(dataset)`.

    Example:

    >>> import keras_replicator as kr
    >>> strategy = kr.MultiDeviceReplicator(num_replicas=1)
    >>> data = tf.data.Dataset.range(4).batch(2)
    >>> input_for_fit(strategy, data) is data
    True
    """
    if isinstance(dataset, tf.distribute.DistributedDataset):
        return dataset
    if not _one_replica_per_worker(strategy):
        return strategy.experimental_distribute_dataset(dataset)
    if not _compat.in_multi_worker_mode(strategy):
        return to_replica_device(strategy, dataset)
    distributed = strategy.experimental_distribute_dataset(dataset)
    if not same_batch_count_on_every_worker(dataset, num_batches, may_read_files):
        return distributed
    local = _compat.data.worker_dataset(distributed)
    return distributed if local is None else to_replica_device(strategy, local)


def to_replica_device(strategy, dataset):
    """`dataset`, prefetched to the one local replica's device on GPUs.

    Args:
        strategy: A strategy with one replica on this worker.
        dataset: The `tf.data.Dataset` that replica is fed plainly.

    Returns:
        On GPUs, `dataset` copied to the replica's device from this worker's
        host and buffered there (`DEVICE_BUFFER_BATCHES` batches); elsewhere,
        or when an element holds what GPU memory cannot (strings, ragged or
        sparse components, which the step's own ops place), `dataset` itself.

    Example:

    >>> import keras_replicator as kr
    >>> data = tf.data.Dataset.range(4).batch(2)
    >>> to_replica_device(kr.MultiDeviceReplicator(num_replicas=1), data) is data
    True
    """
    if _platform.platform_of(strategy) != _platform.GPU:
        return dataset
    if not all(
        type(spec) is tf.TensorSpec and spec.dtype not in _HOST_DTYPES
        for spec in tf.nest.flatten(dataset.element_spec)
    ):
        return dataset
    (device,) = strategy.extended.worker_devices
    # `prefetch_to_device` is this copy and buffer, but copies from "/cpu:0":
    # named in full, the source is this worker's host, wherever TF resolves it.
    host = tf.DeviceSpec.from_string(device).replace(device_type="CPU", device_index=0)
    copied = dataset.apply(
        tf.data.experimental.copy_to_device(device, source_device=host.to_string())
    )
    return copied.prefetch(DEVICE_BUFFER_BATCHES)


def same_batch_count_on_every_worker(
    dataset, num_batches=None, may_read_files=True
) -> bool:
    """Whether TF's auto-sharding gives every worker as many batches as `dataset`.

    Args:
        dataset: A batched `tf.data.Dataset`, as `fit` gets it.
        num_batches: Its length when known otherwise (Keras' data adapter), or None.
        may_read_files: Whether `dataset` may read files (a pipeline the user
            built); only then is its graph inspected for readers, under `AUTO`.

    Returns:
        True when the length is known (or infinite) and the sharding policy gives
        each worker one batch per global batch (see the module docstring).

    Example:

    >>> data = tf.data.Dataset.range(10).batch(4)
    >>> same_batch_count_on_every_worker(data)
    True
    >>> same_batch_count_on_every_worker(data.filter(lambda b: True))
    False
    """
    length = int(dataset.cardinality())
    known = length >= 0 or length == int(tf.data.INFINITE_CARDINALITY)
    if not known and num_batches is None:
        return False
    policy = dataset.options().experimental_distribute.auto_shard_policy
    # `OFF` is how a pipeline that shards itself by hand says so: its workers'
    # lengths may differ.
    if policy not in (_POLICY.AUTO, _POLICY.DATA):
        return False
    if policy == _POLICY.DATA or not may_read_files:
        return True
    # The pipeline's graph (the arrays it holds included: TF's auto-sharding
    # serializes it too, when the iterator starts): readers, or the tf.data service.
    types = _compat.data.dataset_op_types(dataset)
    if not types:  # not serializable (over 2 GB, or state it cannot save)
        return False
    return not any(
        name.startswith(_FILE_SOURCES + (_SERVICE_PREFIX,)) for name in types
    )


def _one_replica_per_worker(strategy) -> bool:
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return False
    return len(strategy.extended.worker_devices) == 1
