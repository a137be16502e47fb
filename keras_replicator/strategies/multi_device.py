"""`MultiDeviceReplicator`: synchronous replicas on the devices of one machine."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from keras_replicator import _compat, _platform
from keras_replicator.communication import _compression
from keras_replicator.communication import options as _options
from keras_replicator.communication._collective_transport import CollectiveTransport
from keras_replicator.strategies import _devices
from keras_replicator.strategies._replicator import ReplicatorMixin


class MultiDeviceReplicator(ReplicatorMixin, tf.distribute.MirroredStrategy):
    """Synchronous data parallelism over the GPUs (or logical CPUs) of one machine.

    A `tf.distribute.MirroredStrategy` whose Keras `fit`, `evaluate` and `predict`
    give the same numbers as one device at the same global batch: uneven last
    batches, `steps_per_execution`, `jit_compile`, string inputs and mixed precision
    included. Gradients are averaged across replicas weighted by each replica's
    sample count.

    Without GPUs, `num_replicas=N` splits the host CPU into N logical devices, so
    distributed code can be developed and tested on a laptop.

    Args:
        devices: Device names, as for `tf.distribute.MirroredStrategy`. Defaults to
            `None`: every local GPU, else `num_replicas` logical CPU devices.
        cross_device_ops: A `tf.distribute.CrossDeviceOps`, as for the parent.
            Defaults to `None` (TensorFlow's choice).
        num_replicas: Number of replicas when `devices` is not given. Defaults to
            `None`: all local GPUs, or the current number of logical CPUs.
        all_reduce: A `kr.AllReduceOptions` for the gradient all-reduce (buckets,
            wire compression, weight-update sharding: here each bucket is
            reduce-scattered (NCCL's on GPUs; on CPUs all-reduced and sliced),
            then all-gathered). Defaults to `None`: `kr.AllReduceOptions()`.
            On GPUs TensorFlow's collectives here are NCCL's (its default for
            physical GPUs), so `compression="bf16"` is refused: use `"fp16"`.

    Raises:
        ValueError: If `num_replicas` devices cannot be made, `devices` and
            `num_replicas` disagree, or the devices cannot sum the wire format.

    Example:
    >>> import keras, keras_replicator as kr
    >>> strategy = kr.MultiDeviceReplicator(num_replicas=2)
    >>> strategy.num_replicas_in_sync
    2
    """

    def __init__(
        self, devices=None, cross_device_ops=None, *, num_replicas=None, all_reduce=None
    ):
        options = _options.validate(all_reduce)
        if options.transport == "socket":
            raise ValueError(
                "`transport='socket'` connects worker processes; on one machine "
                "use transport=None or 'collective'. Received: "
                f"transport={options.transport!r}. For the ring, use "
                "kr.MultiWorkerReplicator."
            )
        _devices.validate_num_replicas(num_replicas)
        if devices is None:
            devices = _devices.local_replica_devices(num_replicas)
        elif num_replicas is not None and len(devices) != num_replicas:
            raise ValueError(
                "`num_replicas` must match the number of `devices` when both are "
                f"given. Received: num_replicas={num_replicas}, devices={devices}. "
                "Pass only one of them."
            )
        platform = _platform.platform_of_devices(
            [getattr(d, "name", d) for d in devices]  # strings or LogicalDevices
        )
        # Logical GPUs split from one keep TensorFlow's RING (as its own
        # MirroredStrategy does): NCCL refuses two ranks on one GPU.
        nccl = platform == _platform.GPU and not _platform.virtual_gpus_in_use()
        _compression.check_wire_format(options.compression, platform, nccl=nccl)
        state = self._register_state()
        super().__init__(devices=devices, cross_device_ops=cross_device_ops)
        state.platform = _platform.platform_of_devices(self.extended.worker_devices)
        state.nccl = nccl
        state.transport = CollectiveTransport(
            dataclasses.replace(options, transport="collective"), nccl=nccl
        )
        state.is_multi_worker = _compat.in_multi_worker_mode(self)
