"""Choosing local replica devices: GPUs when present, else logical CPU devices."""

from __future__ import annotations

import tensorflow as tf


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


def local_replica_devices(num_replicas: int | None = None) -> list[str]:
    """Device names for `num_replicas` local replicas.

    GPUs are used when there are any. Without GPUs the host CPU is split into
    `num_replicas` logical devices, which is only possible before TensorFlow
    initialises its devices; afterwards, an existing split with at least
    `num_replicas` logical CPUs is reused.
    """
    validate_num_replicas(num_replicas)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if num_replicas is not None and num_replicas > len(gpus):
            raise ValueError(
                f"`num_replicas` is larger than the {len(gpus)} local GPUs. "
                f"Received: num_replicas={num_replicas}. Pass at most {len(gpus)}."
            )
        return [f"/gpu:{i}" for i in range(num_replicas or len(gpus))]
    return [f"/cpu:{i}" for i in range(_split_cpu(num_replicas))]


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
