"""`auto()`: the right Replicator strategy for the machine the script runs on."""

from __future__ import annotations

import os
import shutil
import sys

import tensorflow as tf

from keras_replicator import _tf_config
from keras_replicator.strategies import _cluster_config, _devices
from keras_replicator.strategies.multi_device import MultiDeviceReplicator
from keras_replicator.strategies.multi_worker import MultiWorkerReplicator
from keras_replicator.strategies.parameter_server import ParameterServerReplicator
from keras_replicator.strategies.tpu import TPUReplicator, tpu_environment_hint


def _slurm_cluster() -> bool:
    return (
        bool(os.environ.get("SLURM_JOB_ID"))
        and int(os.environ.get("SLURM_NTASKS", "1")) > 1
    )


def _slurm_resolver():
    # SlurmClusterResolver() runs nvidia-smi to count GPUs and fails on CPU nodes;
    # there, give it one task per "GPU" slot and let it set no devices.
    resolver_class = tf.distribute.cluster_resolver.SlurmClusterResolver
    if os.environ.get("CUDA_VISIBLE_DEVICES") or shutil.which("nvidia-smi"):
        return resolver_class()
    tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", os.environ["SLURM_NTASKS"]))
    return resolver_class(gpus_per_node=tasks, gpus_per_task=1, auto_set_gpu=False)


def auto(num_replicas: int | None = None, *, verbose: bool = True):
    """Picks TPU, then a multi-worker cluster, then local devices, then one device.

    1. A TPU, if the environment shows one (Colab, Cloud TPU VM): `TPUReplicator`.
    2. A cluster described by `TF_CONFIG` (e.g. a Kubernetes TFJob or
       `keras-replicator launch`) or by Slurm (`SLURM_NTASKS` > 1):
       `MultiWorkerReplicator`; `ParameterServerReplicator` when `TF_CONFIG`
       lists `ps` tasks (on worker and ps tasks, this serves and blocks).
    3. Several local GPUs, or `num_replicas` logical CPUs: `MultiDeviceReplicator`.
    4. Otherwise one device (a `MultiDeviceReplicator` with one replica, so the
       replica API works the same).

    Args:
        num_replicas: Local replicas to make when there is no GPU (the CPU is
            split) or to use of the local GPUs. Defaults to `None`:
            `KERAS_REPLICATOR_NUM_REPLICAS` if set, else every local device.
        verbose: Print which strategy was picked and why. Defaults to `True`.

    Returns:
        A Replicator strategy; its `selection_reason` attribute says why.

    Example:
    >>> import keras_replicator as kr
    >>> strategy = kr.auto(num_replicas=2, verbose=False)
    """
    if num_replicas is None and os.environ.get("KERAS_REPLICATOR_NUM_REPLICAS"):
        raw = os.environ["KERAS_REPLICATOR_NUM_REPLICAS"]
        if not raw.isdigit():
            raise ValueError(
                "`KERAS_REPLICATOR_NUM_REPLICAS` must be a positive integer. "
                f"Received: KERAS_REPLICATOR_NUM_REPLICAS={raw!r}."
            )
        num_replicas = int(raw)
    _devices.validate_num_replicas(num_replicas)

    hint = tpu_environment_hint()
    if hint:
        strategy = TPUReplicator()
        reason = f"a TPU was found ({hint})"
    elif _cluster_config.has_parameter_servers(_tf_config.read_tf_config()):
        # On worker and ps tasks this serves and never returns.
        strategy = ParameterServerReplicator()
        reason = f"TF_CONFIG lists parameter servers ({strategy.num_workers} workers)"
    elif _cluster_config.describes_cluster(_tf_config.read_tf_config()):
        strategy = MultiWorkerReplicator()
        reason = f"TF_CONFIG describes a cluster of {strategy.num_workers} workers"
    elif _slurm_cluster():
        resolver = _slurm_resolver()
        strategy = MultiWorkerReplicator(cluster_resolver=resolver)
        reason = f"Slurm runs {os.environ['SLURM_NTASKS']} tasks"
    else:
        strategy = MultiDeviceReplicator(num_replicas=num_replicas)
        kind = "GPU" if tf.config.list_physical_devices("GPU") else "logical CPU"
        count = strategy.num_replicas_in_sync
        reason = (
            f"no TPU or cluster; {count} local {kind} device(s)"
            if count > 1
            else "no TPU, cluster, GPUs or CPU split: one device"
        )
    strategy.selection_reason = reason
    if verbose:
        print(
            f"keras_replicator.auto: {type(strategy).__name__} with "
            f"{strategy.num_replicas_in_sync} replica(s), because {reason}.",
            file=sys.stderr,
        )
    return strategy
