"""`auto()`: the right Replicator strategy for the machine the script runs on."""

from __future__ import annotations

import os
import sys
import warnings

import tensorflow as tf

from keras_replicator import _slurm_gpus, _tf_config
from keras_replicator._environment import NUM_REPLICAS
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
    # SlurmClusterResolver() runs nvidia-smi to count GPUs and fails on CPU nodes,
    # and it would undo GPUs `srun` bound per task; in both cases it derives only
    # the cluster and leaves CUDA_VISIBLE_DEVICES alone (see _slurm_gpus).
    resolver_class = tf.distribute.cluster_resolver.SlurmClusterResolver
    arguments = _slurm_gpus.resolver_arguments()
    resolver = resolver_class(**arguments)
    if arguments and _slurm_gpus.slurm_bound_gpus() is None:
        # A node without GPUs: the resolver's one pseudo-GPU per task is only
        # how its cluster is derived; the strategy must see none (it would
        # place replicas on a /gpu:0 that does not exist, and run NCCL).
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            resolver.cluster_spec(),
            task_type=resolver.task_type,
            task_id=resolver.task_id,
            num_accelerators={},
            rpc_layer=resolver.rpc_layer,
        )
    return resolver


def auto(num_replicas: int | None = None, *, verbose: bool = True):
    """Picks TPU, then a multi-worker cluster, then local devices, then one device.

    1. A TPU, if the environment shows one (Colab, Cloud TPU VM): `TPUReplicator`.
       If it cannot be initialised (no TPU build of TensorFlow, a TPU another
       process holds, a stale `TPU_NAME`), a `RuntimeWarning` names the error
       and the next rule applies.
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
    if num_replicas is None and os.environ.get(NUM_REPLICAS):
        raw = os.environ[NUM_REPLICAS]
        if not raw.isdigit():
            raise ValueError(
                f"`{NUM_REPLICAS}` must be a positive integer. "
                f"Received: {NUM_REPLICAS}={raw!r}."
            )
        num_replicas = int(raw)
    _devices.validate_num_replicas(num_replicas)

    tpu, tpu_reason = _tpu_or_none(tpu_environment_hint(), num_replicas)
    if tpu is not None:
        strategy, reason = tpu, tpu_reason
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
    if tpu is None and tpu_reason:
        reason = f"{reason} ({tpu_reason})"
    strategy.selection_reason = reason
    if verbose:
        print(
            f"keras_replicator.auto: {type(strategy).__name__} with "
            f"{strategy.num_replicas_in_sync} replica(s), because {reason}.",
            file=sys.stderr,
        )
    return strategy


def _tpu_or_none(hint: str | None, num_replicas: int | None):
    """`(TPUReplicator, reason)`, or `(None, why not)` after a warning."""
    if not hint:
        return None, None
    if num_replicas and not tf.config.get_visible_devices("GPU"):
        # A failed TPU initialisation starts TensorFlow's devices, after which
        # the CPU can no longer be split for the fallback: split it first (the
        # TPU's host does not use the extra logical CPUs).
        try:
            _devices.local_replica_devices(num_replicas)
        except ValueError:
            pass  # already started with fewer: the fallback reports it
    try:
        return TPUReplicator(), f"a TPU was found ({hint})"
    except (RuntimeError, ValueError, tf.errors.OpError) as error:
        failure = f"{type(error).__name__}: {error}"
        warnings.warn(
            f"keras_replicator.auto: the environment shows a TPU ({hint}), but it "
            f"could not be initialised ({failure}). Falling back to the next "
            "strategy (a cluster, local GPUs or the CPU). On a TPU VM install the "
            "TPU build of TensorFlow (`pip install keras-replicator[tpu]`) and check "
            "that no other process holds the TPU; to skip the TPU, unset TPU_NAME / "
            "COLAB_TPU_ADDR / TPU_ACCELERATOR_TYPE.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None, f"the TPU could not be initialised: {type(error).__name__}"
