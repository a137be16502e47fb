"""`TPUReplicator`: synchronous replicas on the cores of a Cloud TPU or Colab TPU."""

from __future__ import annotations

import dataclasses
import os

import tensorflow as tf

from keras_replicator import _platform
from keras_replicator.communication import _compression
from keras_replicator.communication import options as _options
from keras_replicator.communication._collective_transport import CollectiveTransport
from keras_replicator.strategies._replicator import ReplicatorMixin

# A TPU attached to this host: /dev/accel* on TPU v2-v4 VMs, VFIO groups on
# v5e / v6e VMs (libtpu opens the chips through /dev/vfio there).
LOCAL_TPU_DEVICES = ("/dev/accel0", "/dev/vfio/0")


def local_tpu_device() -> str | None:
    """The device file of a TPU attached to this host (a Cloud TPU VM), or None."""
    for path in LOCAL_TPU_DEVICES:
        if os.path.exists(path):
            return path
    return None


def tpu_environment_hint() -> str | None:
    """Why this machine looks like it has a TPU, or None (never touches the network)."""
    for variable in ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE"):
        if os.environ.get(variable):
            return f"{variable} is set"
    device = local_tpu_device()
    if device is not None:
        return f"TPU device files exist ({device})"
    return None


def connect_tpu(tpu=None):
    """Resolves, connects to and initialises a TPU system; returns the resolver."""
    if isinstance(tpu, tf.distribute.cluster_resolver.TPUClusterResolver):
        resolver = tpu
    else:
        if tpu is None and local_tpu_device() is not None:
            tpu = "local"  # Cloud TPU VM: the TPU is attached to this host.
        if tpu is None and tpu_environment_hint() is None:
            # Without a hint the resolver would query cloud metadata servers; a
            # machine with no TPU environment variables and no TPU device has none.
            raise RuntimeError(
                "No TPU is reachable: no TPU_NAME, COLAB_TPU_ADDR or "
                "TPU_ACCELERATOR_TYPE variable and no TPU device file. Received: "
                "tpu=None. On Colab choose Runtime > Change runtime type > TPU; "
                "elsewhere pass the TPU's name, or use `keras_replicator.auto()`, "
                "which falls back to GPUs or CPU."
            )
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        except (ValueError, RuntimeError) as error:
            raise RuntimeError(
                f"No TPU is reachable ({error}). Received: tpu={tpu!r}. On Colab "
                "choose Runtime > Change runtime type > TPU; on a Cloud TPU VM pass "
                "tpu='local'; elsewhere use `keras_replicator.auto()`, which falls "
                "back to GPUs or CPU."
            ) from None
    if resolver.master() not in ("", "local"):
        tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return resolver


class TPUReplicator(ReplicatorMixin, tf.distribute.TPUStrategy):
    """Synchronous data parallelism on the cores of a TPU (Colab or Cloud TPU VM).

    Connects to and initialises the TPU system from a resolver, so
    `TPUReplicator()` is all a notebook needs. Keras' TPU path (`steps_per_execution`,
    XLA everywhere) is used with our step builders; collectives from
    `keras_replicator.replica` use TPU cross-replica ops.

    Args:
        tpu: A TPU name or address, `"local"` on a TPU VM, or a
            `TPUClusterResolver`. Defaults to `None`: discovered from the
            environment (Colab, TPU VM).
        experimental_device_assignment: As for `tf.distribute.TPUStrategy`.
            Defaults to `None`.
        all_reduce: A `kr.AllReduceOptions`. On a TPU only `compression` changes
            the traffic (the cast is compiled into the XLA step; `"bf16"` only:
            float16 is no TPU type, so `"fp16"` is refused); XLA's all-reduce
            combiner re-fuses buckets, so `bucket_mb` only changes the graph;
            `hierarchy` must be `None` (the interconnect's all-reduce is already
            a 2-D torus reduction); `shard_weight_update=True` all-reduces and
            slices each bucket and all-gathers the updated pieces (the
            collectives path of `MultiDeviceReplicator`).
            Untested on TPU hardware. Defaults to `None`: `kr.AllReduceOptions()`.

    Raises:
        RuntimeError: If no TPU is reachable.
        ValueError: If `all_reduce` asks for what a TPU cannot do (`"fp16"`,
            `hierarchy`, `transport="socket"`).

    Example:
    >>> import keras_replicator as kr
    >>> strategy = kr.TPUReplicator()  # doctest: +SKIP
    """

    def __init__(
        self, tpu=None, experimental_device_assignment=None, *, all_reduce=None
    ):
        options = _options.validate(all_reduce)
        if options.transport == "socket":
            raise ValueError(
                "`transport` must be None or 'collective' on a TPU. Received: "
                f"transport={options.transport!r}."
            )
        _compression.check_wire_format(options.compression, _platform.TPU)
        if options.hierarchy is not None:
            raise ValueError(
                "`hierarchy` must be None on a TPU: the TPU interconnect already "
                "all-reduces over its 2-D torus (Ying et al.'s scheme), and the "
                "sub-group collectives it is built from have no TPU kernels. "
                f"Received: hierarchy={options.hierarchy!r}."
            )
        resolver = connect_tpu(tpu)
        state = self._register_state()
        super().__init__(
            tpu_cluster_resolver=resolver,
            experimental_device_assignment=experimental_device_assignment,
        )
        state.platform = _platform.TPU
        state.transport = CollectiveTransport(
            dataclasses.replace(options, transport="collective")
        )
        # A pod's hosts are one program to Keras' steps: no cross-worker logs.
        state.is_multi_worker = False
