"""Placement: the devices each replica on a worker runs its pipeline stages on.

In a Replicator's scope every replica runs the whole pipeline. With one replica per
worker (CPU workers, one GPU per process, `MultiDeviceReplicator(num_replicas=1)`)
that replica runs stage k on `devices[k]`, the worker's devices. GPU workers have
one replica per GPU (TensorFlow's multi-worker and mirrored strategies take every
local GPU): if each of them put stage k on `devices[k]`, every replica would run its
stage 0 on GPU 0 and its stage 1 on GPU 1, so the first K GPUs would do (and hold
the activations of) every replica's work while the others only hold variables.

So with several replicas on a worker's GPUs each replica runs its stage 0 on its
own GPU (where its batch, its variables and its loss already are) and its later
stages on its own share of the devices that are no replica's: `devices` minus the
replica devices, split in order into equal shares. A layout that leaves a replica
fewer devices than stages (one replica per GPU has no spare GPU) is refused when
the pipeline is built, naming the remedy: fewer replicas per worker, each owning
K GPUs.

On CPU, logical devices share one process's memory and thread pools, so placement
changes nothing there and every replica keeps `devices[k]`, as before. TPU
replicas are left as they were (their replica id is not known while tracing).
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator import _platform


def replica_devices(strategy) -> list[str]:
    """This worker's replica devices under `strategy`; [] for the default one."""
    try:
        return list(strategy.extended.worker_devices)
    except (RuntimeError, NotImplementedError, AttributeError):
        return []


def device_groups(devices, replicas, platform: str) -> list[list[str]]:
    """For each replica on this worker, the devices its stages run on, in order.

    Args:
        devices: The worker's devices the pipeline may use (`GPipe`'s `devices`).
        replicas: The worker's replica devices (`replica_devices`).
        platform: `"CPU"`, `"GPU"` or `"TPU"` (`_platform.platform_of`).

    Returns:
        One list per local replica (one list without a strategy): `devices`
        itself unless several replicas share a worker's GPUs; then each
        replica's own device followed by its share of the spare devices.

    Example:
    >>> device_groups(["/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"],
    ...               ["/job:worker/task:0/device:GPU:0", "/device:GPU:1"], "GPU")
    [['/gpu:0', '/gpu:2'], ['/gpu:1', '/gpu:3']]
    >>> device_groups(["/cpu:0", "/cpu:1"], ["/cpu:0", "/cpu:1"], "CPU")
    [['/cpu:0', '/cpu:1'], ['/cpu:0', '/cpu:1']]
    """
    devices = list(devices)
    if not shares_out(replicas, platform):
        return [devices] * max(len(replicas), 1)
    taken = {_local_name(d) for d in replicas}
    spare = [d for d in devices if _local_name(d) not in taken]
    share = len(spare) // len(replicas)
    return [
        [_local_name(own), *spare[r * share : (r + 1) * share]]
        for r, own in enumerate(replicas)
    ]


def shares_out(replicas, platform: str) -> bool:
    """Whether the replicas take devices of their own: several on GPUs."""
    return len(replicas) > 1 and platform == _platform.GPU


def local_replica(num_local_replicas: int) -> int:
    """The index on this worker of the replica whose step is being built.

    0 outside a replica context, with one local replica, or when the replica id is
    not a constant (TPU).
    """
    context = tf.distribute.get_replica_context()
    if context is None or num_local_replicas <= 1:
        return 0
    replica_id = tf.get_static_value(context.replica_id_in_sync_group)
    # Replica ids run worker by worker, `num_local_replicas` per worker
    # (`_get_replica_id_in_sync_group` of TF's multi-worker strategy).
    return 0 if replica_id is None else int(replica_id) % num_local_replicas


def too_few_devices_error(num_stages: int, replicas, devices) -> ValueError:
    """The error for several GPU replicas per worker that cannot own K devices."""
    return ValueError(
        f"`GPipe` needs {num_stages} devices per replica (one per stage), but the "
        f"strategy runs {len(replicas)} replicas on this worker and `devices` "
        "leaves each replica its own device plus "
        f"{max(len(devices) - len(replicas), 0) // len(replicas)} spare one(s); "
        "replicas sharing a GPU would run every replica's stage k on the same "
        f"GPU. Received: replica devices={list(replicas)!r}, "
        f"devices={list(devices)!r}. Give each replica {num_stages} GPUs: fewer "
        "replicas per worker (`kr.MultiDeviceReplicator(num_replicas=n)`; for "
        "`kr.MultiWorkerReplicator`, a cluster resolver whose "
        '`num_accelerators()` is `{"GPU": n}`), or fewer stages.'
    )


def _local_name(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    return f"/{(spec.device_type or 'CPU').lower()}:{spec.device_index or 0}"
