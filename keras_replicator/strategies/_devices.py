"""Choosing local replica devices: GPUs when present, else logical CPU devices.

More replicas than devices are made by splitting a device into logical devices,
as TensorFlow's own distribution tests do (`tf.distribute` test_util's
`set_logical_devices_to_at_least`): the host CPU into `num_replicas` logical
CPUs, or each of G GPUs into `num_replicas / G` logical GPUs. Replicas that
share a GPU share its compute and memory, so a split is for running and testing
distributed code on a small machine (a laptop, a 1-GPU Colab), never for speed;
the GPU split says so in a warning.

A logical GPU needs a memory limit (TensorFlow refuses one without), and
`tf.config.experimental.get_device_details` does not report the memory of a
GPU that TensorFlow has not started yet. The limit is therefore
`KERAS_REPLICATOR_GPU_MEMORY_MB` when set, else 90% of the smallest free GPU
memory that `nvidia-smi` reports, shared equally (free, not total: another
process may hold part of the GPU; the 10% is left for the CUDA context), else
1024 MB: small enough that 4 logical GPUs fit on any GPU with 5 GB or more, and
the demo and the notebooks ask for at most 4.

Both splits can only be made before TensorFlow initialises its devices (the
first op); afterwards an existing split with enough logical devices is reused.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import warnings

import tensorflow as tf

from keras_replicator import _environment
from keras_replicator.layouts._clients import cluster_clients, start_clients

GPU_MEMORY_ENV = _environment.GPU_MEMORY_MB
# Used when neither the environment nor nvidia-smi gives a size (see above).
FALLBACK_GPU_MEMORY_MB = 1024
# Share of the smallest GPU's free memory given to its logical GPUs together.
GPU_MEMORY_FRACTION = 0.9


def validate_num_replicas(num_replicas) -> None:
    if num_replicas is None:
        return
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int):
        raise TypeError(
            "`num_replicas` must be a positive integer or None. "
            f"Received: num_replicas={num_replicas!r} of type "
            f"{type(num_replicas).__name__}."
        )
    if num_replicas < 1:
        raise ValueError(
            "`num_replicas` must be a positive integer or None. "
            f"Received: num_replicas={num_replicas}. Pass 1 or more, or None to use "
            "every local device."
        )


def devices(count: int) -> list[str]:
    """`count` devices, named as `keras.distribution.DeviceMesh` takes them.

    The GPUs when there are any, else logical CPU devices, as for
    `kr.MultiDeviceReplicator(num_replicas=count)`: the host CPU (or each GPU) is
    split when there are fewer, which only works before TensorFlow starts.

    In a worker of a multi-worker run (a `TF_CONFIG` with two or more chief or
    worker tasks, as `keras-replicator launch` sets, or DTensor's own
    `DTENSOR_JOBS`), the devices are the whole cluster's: `count / workers` on
    each worker, named globally (`/job:worker/replica:0/task:1/device:CPU:0`),
    worker by worker. This call joins the workers (DTensor's multi-client mode,
    `docs/layouts.md`), so it must come before any other TensorFlow call.

    Args:
        count: How many devices. A positive integer.

    Raises:
        TypeError: `count` is not an integer.
        ValueError: `count` is not positive, or the devices cannot be made.

    Example:
    >>> import keras, keras_replicator as kr
    >>> kr.devices(2)  # on a machine without GPUs
    ['cpu:0', 'cpu:1']
    >>> keras.distribution.DeviceMesh((2,), ["batch"], kr.devices(2)).shape
    (2,)
    """
    if count is None:
        raise TypeError(
            "`count` must be a positive integer. Received: count=None. Pass how "
            "many devices the mesh has, e.g. kr.devices(4)."
        )
    validate_num_replicas(count)
    clients = cluster_clients()
    if clients is not None:
        device_type = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
        return start_clients(clients, count, device_type)
    return [name.lstrip("/") for name in local_replica_devices(count)]


def local_replica_devices(num_replicas: int | None = None) -> list[str]:
    """Device names for `num_replicas` local replicas.

    The visible GPUs are used when there are any (`None`: every logical GPU).
    More replicas than GPUs split each of the G GPUs into `num_replicas / G`
    logical GPUs, with a warning; fewer are spread over the physical GPUs.
    Without GPUs the host CPU is split into `num_replicas` logical devices. A
    split is only possible before TensorFlow initialises its devices;
    afterwards, an existing split with enough logical devices is reused.

    Example:
    >>> local_replica_devices(2)  # on a machine without GPUs
    ['/cpu:0', '/cpu:1']
    """
    validate_num_replicas(num_replicas)
    gpus = tf.config.get_visible_devices("GPU")
    if gpus:
        return [f"/gpu:{i}" for i in _gpu_indices(gpus, num_replicas)]
    return [f"/cpu:{i}" for i in range(_split_cpu(num_replicas))]


def _logical_gpus(gpus) -> list[list[int]]:
    """TensorFlow's logical GPU indices, grouped by physical GPU."""
    groups, start = [], 0
    for gpu in gpus:
        count = len(tf.config.get_logical_device_configuration(gpu) or [None])
        groups.append(list(range(start, start + count)))
        start += count
    return groups


def _gpu_indices(gpus, num_replicas: int | None) -> list[int]:
    groups = _logical_gpus(gpus)
    available = sum(len(group) for group in groups)
    if num_replicas is None:
        return list(range(available))
    if num_replicas > available:
        _split_gpus(gpus, num_replicas)
        groups = _logical_gpus(gpus)
    # One replica per physical GPU before a second one on any of them.
    spread = [
        i for layer in itertools.zip_longest(*groups) for i in layer if i is not None
    ]
    return sorted(spread[:num_replicas])


def _split_gpus(gpus, num_replicas: int) -> None:
    count = len(gpus)
    if num_replicas % count:
        below = count * (num_replicas // count)
        raise ValueError(
            f"`num_replicas` must be at most the {count} local GPUs or a multiple "
            f"of {count}, so that every GPU holds the same number of replicas. "
            f"Received: num_replicas={num_replicas} with {count} GPUs. Pass "
            f"num_replicas={below} or {below + count}."
        )
    per_gpu = num_replicas // count
    memory = logical_gpu_memory_mb(per_gpu)
    config = [tf.config.LogicalDeviceConfiguration(memory_limit=memory)] * per_gpu
    try:
        for gpu in gpus:
            tf.config.set_logical_device_configuration(gpu, config)
    except RuntimeError:
        existing = len(tf.config.list_logical_devices("GPU"))
        raise ValueError(
            f"`num_replicas={num_replicas}` logical GPUs cannot be made: TensorFlow "
            f"already initialised its devices with {existing} logical GPU(s) on "
            f"{count} GPU(s). Received: num_replicas={num_replicas}. Create the "
            "strategy before running any TensorFlow op (e.g. in the first notebook "
            f"cell), or pass num_replicas<={existing}."
        ) from None
    warnings.warn(
        f"`num_replicas={num_replicas}` is more than the {count} local GPU(s): "
        f"each GPU is split into {per_gpu} logical GPUs of {memory} MB "
        f"(`{GPU_MEMORY_ENV}` sets the size). The replicas share the GPU's "
        "compute and memory: this is for testing and demos and gives no "
        f"speed-up. Pass num_replicas<={count} for one replica per GPU.",
        stacklevel=2,
    )


def logical_gpu_memory_mb(per_gpu: int) -> int:
    """Memory limit in MB of each of `per_gpu` logical GPUs on one GPU.

    `KERAS_REPLICATOR_GPU_MEMORY_MB` if set; else 90% of the smallest free GPU
    memory (from `nvidia-smi`) shared equally; else 1024.

    Example:
    >>> logical_gpu_memory_mb(4) >= 1  # 1024 without nvidia-smi or the variable
    True
    """
    raw = os.environ.get(GPU_MEMORY_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(
                f"`{GPU_MEMORY_ENV}` must be a positive number of megabytes per "
                f"logical GPU. Received: {GPU_MEMORY_ENV}={raw!r}. Set e.g. 2048, "
                "or unset it to share the GPU's memory equally."
            )
        return int(raw)
    free = _smallest_free_gpu_memory_mb()
    if free is None:
        return FALLBACK_GPU_MEMORY_MB
    return max(int(free * GPU_MEMORY_FRACTION) // per_gpu, 1)


def _smallest_free_gpu_memory_mb() -> int | None:
    """The smallest free memory `nvidia-smi` reports, or None without it.

    The smallest over every GPU of the machine, as `CUDA_VISIBLE_DEVICES` and
    TensorFlow may number the GPUs differently from `nvidia-smi`.
    """
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return None
    try:
        output = subprocess.run(
            [executable, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        sizes = [int(float(line)) for line in output.split() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return min(sizes) if sizes else None


def _split_cpu(num_replicas: int | None) -> int:
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu) or []
    available = max(len(configured), 1)
    if num_replicas is None:
        return available
    if available >= num_replicas:
        return num_replicas
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * num_replicas
        )
    except RuntimeError:
        existing = len(tf.config.list_logical_devices("CPU"))
        raise ValueError(
            f"`num_replicas={num_replicas}` logical CPU devices cannot be made: "
            f"TensorFlow already initialised its devices with {existing} logical CPU "
            f"device(s). Received: num_replicas={num_replicas}. Create the strategy "
            "before running any TensorFlow op (e.g. in the first notebook cell, or "
            f"call `keras_replicator.split_cpu({num_replicas})` at start-up), or pass "
            f"num_replicas<={existing}."
        ) from None
    return num_replicas


def split_cpu(num_devices: int) -> None:
    """Splits the host CPU into `num_devices` logical devices (call at start-up).

    Example:
    >>> import keras_replicator as kr
    >>> kr.split_cpu(4)
    """
    validate_num_replicas(num_devices)
    _split_cpu(num_devices)
