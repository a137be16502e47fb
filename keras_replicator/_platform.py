"""Which accelerator a strategy's replicas run on, and what follows from it.

TensorFlow picks kernels and collective implementations by device, and several
of its paths accept less on an accelerator than on a CPU: its NCCL wrapper sums
half / float / double / int32 / int64 only
(`tensorflow/core/nccl/nccl_manager.cc`), a collective placed on a GPU runs
NCCL only when it is hinted `"nccl"` (with `"auto"`, reduce-scatter finds no
implementation at all: `collective_param_resolver_local.cc`), and a TPU step is
one XLA program (no Python callbacks, no dynamic shapes, no float64 on the
chip). Every decision the library takes about wire dtypes, collective hints and
host round trips asks this module which of the three platforms it is on, so
each is taken once, where the devices are known, and can be checked on a CPU
by building the step with GPU or TPU device strings (`docs/accelerators.md`).

The platform is recorded by our strategies' constructors
(`ReplicatorState.platform`); for a stock strategy it is read from its
devices.

Example:
>>> import keras_replicator._platform as platform
>>> platform.device_platform("/job:worker/task:1/device:GPU:0")
'GPU'
>>> platform.runs_nccl(platform.GPU)
True
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator._replicator_state import replicator_state

CPU, GPU, TPU = "CPU", "GPU", "TPU"

# The dtypes TensorFlow's NCCL wrapper reduces (nccl_manager.cc, "expected data
# types compatible with NCCL"): no bfloat16, no 8- or 16-bit integers.
NCCL_DTYPES = frozenset({tf.float16, tf.float32, tf.float64, tf.int32, tf.int64})


def device_platform(device: str) -> str:
    """`"GPU"`, `"TPU"` or `"CPU"` for a device string (anything else: CPU).

    Example:
    >>> device_platform("/gpu:1"), device_platform("/cpu:0")
    ('GPU', 'CPU')
    """
    kind = (tf.DeviceSpec.from_string(device).device_type or CPU).upper()
    return kind if kind in (GPU, TPU) else CPU


def platform_of_devices(devices) -> str:
    """The platform of a list of replica devices: GPU or TPU if any is one.

    Example:
    >>> platform_of_devices(["/gpu:0", "/gpu:1"])
    'GPU'
    """
    kinds = {device_platform(d) for d in devices}
    for kind in (TPU, GPU):
        if kind in kinds:
            return kind
    return CPU


def platform_of(strategy) -> str:
    """The platform `strategy`'s replicas run on (`CPU` for the default strategy).

    Example:
    >>> import tensorflow as tf
    >>> platform_of(tf.distribute.get_strategy())
    'CPU'
    """
    state = replicator_state(strategy)
    if state is not None and state.platform is not None:
        return state.platform
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return TPU
    try:
        devices = strategy.extended.worker_devices
    except (RuntimeError, NotImplementedError, AttributeError):
        return CPU  # the default strategy: one device, no collectives
    return platform_of_devices(devices)


def virtual_gpus_in_use() -> bool:
    """Whether this process split a GPU into logical GPUs (more logical than
    physical): TensorFlow's own test for keeping RING there
    (`MirroredStrategy`), since NCCL refuses two ranks on one GPU. Starts
    TensorFlow's runtime if it has not started.
    """
    logical = len(tf.config.list_logical_devices("GPU"))
    return logical > len(tf.config.list_physical_devices("GPU"))


def nccl_usable(strategy) -> bool:
    """Whether `strategy`'s collectives may run NCCL.

    GPU replicas, each on a GPU of its own: not logical GPUs split from one
    (`num_replicas` above the GPUs), nor GPUs `keras-replicator launch` made
    workers share. Our strategies record it (`ReplicatorState.nccl`).

    Example:
    >>> import tensorflow as tf
    >>> nccl_usable(tf.distribute.get_strategy())
    False
    """
    state = replicator_state(strategy)
    if state is not None and state.nccl is not None:
        return state.nccl
    return platform_of(strategy) == GPU and not virtual_gpus_in_use()


def runs_nccl(platform: str) -> bool:
    """Whether the collectives on `platform` are NCCL's (GPUs)."""
    return platform == GPU
