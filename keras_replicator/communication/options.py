"""`AllReduceOptions`: how a Replicator strategy moves gradients between replicas."""

from __future__ import annotations

import dataclasses
import math

COMPRESSIONS = (None, "fp16", "bf16")
HIERARCHIES = (None, "local_then_global", "2d")
TRANSPORTS = (None, "collective", "socket")

# Tuned on 2 CPU cores, 2 worker processes on 127.0.0.1, TF 2.21 (see
# benchmarks/allreduce.py and docs/communication.md).
DEFAULT_BUCKET_MB = 16.0


@dataclasses.dataclass(frozen=True)
class AllReduceOptions:
    """How gradients are summed across replicas: buckets, wire precision, hierarchy.

    Every gradient all-reduce of a Replicator strategy (`fit`, `run_steps`,
    `kr.wrap_optimizer`, an optimizer called in a plain `strategy.run` loop) goes
    through one communication layer that these options configure. Gradients are
    fused into buckets of about `bucket_mb` megabytes in reverse layer order, so a
    bucket can be reduced as soon as the backward pass has produced it (Horovod's
    tensor fusion, PyTorch DDP's buckets); a bucket may travel in 16 bits
    (Jia et al. 2018) and be summed hierarchically over a grid whose rows are
    a worker's replicas (Jia et al.; Ying et al. 2018).
    Sample counts that weight the gradient mean are always summed exactly in
    float32, whatever the compression.

    Args:
        bucket_mb: Bucket size in megabytes (10**6 bytes) of the gradients'
            own dtype. `0` sends each dtype's gradients as one buffer (TensorFlow's
            stock behaviour). Defaults to `None`: the library's tuned default,
            16 MB (on 2 CPU workers, 8-32 MB buckets beat 1-4 MB by 10-15% on
            both transports), or 64 MB uncompressed on the socket ring of
            workers that run their ops on one inter-op thread, where no bucket
            can travel during the backward pass and each additional bucket is
            one more point where the workers wait for each other (issue 36,
            docs/communication.md, "Overlap").
        compression: `None` (send float32 / the gradient's dtype), `"bf16"`
            (bfloat16 on the wire: float32's range, 8 bits of mantissa, no
            scaling) or `"fp16"` (float16, 11 bits of mantissa, with a power-of-two
            scale computed from the replicas' largest gradient so that no sum can
            overflow). Only float32 and float64 gradients are compressed.
            Defaults to `None`.
        hierarchy: `None` (one flat all-reduce over every replica),
            `"local_then_global"` (sum a worker's local replicas, all-reduce
            across workers between one leader per worker, broadcast back: Jia et
            al. 2018) or `"2d"` (Ying et al.'s 2-D scheme over the replica grid:
            reduce-scatter along a worker's replicas, all-reduce each slice
            across workers, all-gather back). Both use TensorFlow's native
            sub-group collectives and pay off on multi-GPU workers, where local
            links are much faster than the network; with one worker or one
            replica per worker they reduce to a flat all-reduce. On CPU workers
            with one replica each (the socket ring) and no `group_size`, both
            run on the ring's rows and columns: a machine's workers are a row
            (reduce-scatter and all-gather through shared memory), and each
            shard is all-reduced between machines (the ring does this by
            default wherever the machines form a grid). Not on a TPU (its
            interconnect already reduces over a 2-D torus). See
            docs/communication.md. Defaults to `None`.
        group_size: Replicas per row of the hierarchy's grid (consecutive
            replicas; must divide their number). Only with `hierarchy`.
            Defaults to `None`: the replicas of one worker. Set it to model
            islands inside one machine (e.g. `group_size=4` for two NVLink
            quads of an 8-GPU host, or to test on logical CPUs).
        transport: `"collective"` (TensorFlow's collective ops: gRPC between
            workers, the strategy's cross-device ops on one machine) or
            `"socket"` (our ring all-reduce over plain TCP between the workers of
            a `MultiWorkerReplicator` with one replica per worker: CPU workers;
            3-5x faster than gRPC on loopback, see docs/communication.md). The
            socket transport opens one TCP connection from each worker to the next
            on a free port of the address in `TF_CONFIG`. Defaults to `None`: the
            strategy picks. A `MultiWorkerReplicator` of several CPU workers with
            one replica each and no `group_size` uses the socket ring if every
            worker can open it (else, with a warning, the collectives); every
            other strategy uses the collectives. The choice made is in
            `strategy.all_reduce_options.transport`.
        shard_weight_update: If True, each replica updates only its 1/N share
            of every trainable variable and keeps only that share of the
            optimizer's state (weight-update sharding, as in Google's
            MLPerf-0.6 TPU-pod runs; Xu et al. 2020): gradients are
            reduce-scattered instead of all-reduced, the optimizer runs on this
            replica's slice, and the updated slices are all-gathered into the
            replicated weights. The update's compute and the optimizer state's
            memory are divided by the number of replicas. Over the socket ring
            the update runs between the ring's two phases, and the same bytes
            travel as for an all-reduce; over GPU collectives each bucket is
            reduce-scattered by NCCL, then all-gathered (the same bytes); over
            CPU collectives it is all-reduced and sliced, then all-gathered
            (one collective more).
            Element-wise Keras optimizers (SGD, Adam, AdamW, RMSprop, Adagrad,
            Lion, ...) shard as they are; `kr.optimizers.LARS` and Keras' `Lamb`
            add one small all-reduce of per-variable sums of squares; others
            raise an error naming them. See docs/weight_update_sharding.md.
            Defaults to `False`.

    Raises:
        ValueError: If a field has a value outside those listed, naming the field.

    Example:
    >>> import keras_replicator as kr
    >>> kr.AllReduceOptions(bucket_mb=8, compression="bf16").compression
    'bf16'
    >>> kr.AllReduceOptions().resolved_bucket_mb()
    16.0
    >>> kr.AllReduceOptions(hierarchy="2d", group_size=4).group_size
    4
    >>> kr.AllReduceOptions(shard_weight_update=True).shard_weight_update
    True

    References:
        - Jia et al., 2018. Highly Scalable Deep Learning Training System with
          Mixed-Precision: Training ImageNet in Four Minutes.
        - Sergeev & Del Balso, 2018. Horovod: fast and easy distributed deep
          learning in TensorFlow.
        - Li et al., 2020. PyTorch Distributed: Experiences on Accelerating Data
          Parallel Training.
        - Ying et al., 2018. Image Classification at Supercomputer Scale.
        - Kumar et al., 2019. Scale MLPerf-0.6 models on Google TPU-v3 Pods.
        - Xu et al., 2020. Automatic Cross-Replica Sharding of Weight Update in
          Data-Parallel Training.
    """

    bucket_mb: float | None = None
    compression: str | None = None
    hierarchy: str | None = None
    transport: str | None = None
    group_size: int | None = None
    shard_weight_update: bool = False

    def __post_init__(self):
        bucket = self.bucket_mb
        if bucket is not None and (
            isinstance(bucket, bool)
            or not isinstance(bucket, (int, float))
            or not math.isfinite(bucket)
            or bucket < 0
        ):
            raise ValueError(
                "`bucket_mb` must be a non-negative number of megabytes, 0 for one "
                f"buffer per dtype, or None. Received: bucket_mb={bucket!r}. "
                "Use e.g. bucket_mb=4."
            )
        if self.compression not in COMPRESSIONS:
            raise ValueError(
                f"`compression` must be one of {list(COMPRESSIONS)}. Received: "
                f"compression={self.compression!r}."
            )
        if self.hierarchy not in HIERARCHIES:
            raise ValueError(
                f"`hierarchy` must be one of {list(HIERARCHIES)}. Received: "
                f"hierarchy={self.hierarchy!r}."
            )
        size = self.group_size
        if size is not None and (
            isinstance(size, bool) or not isinstance(size, int) or size < 1
        ):
            raise ValueError(
                "`group_size` must be a positive integer (replicas per row of the "
                f"hierarchy) or None. Received: group_size={size!r}."
            )
        if size is not None and self.hierarchy is None:
            raise ValueError(
                "`group_size` only shapes a hierarchical all-reduce. Received: "
                f"group_size={size!r} with hierarchy=None. Pass "
                "hierarchy='local_then_global' or '2d', or drop group_size."
            )
        if self.transport not in TRANSPORTS:
            raise ValueError(
                f"`transport` must be one of {list(TRANSPORTS)}. Received: "
                f"transport={self.transport!r}."
            )
        if self.group_size is not None and self.transport == "socket":
            raise ValueError(
                "`group_size` needs transport='collective': on the socket ring the "
                "rows are the machines, found by the ring. Received: "
                f"group_size={self.group_size!r}, transport={self.transport!r}. "
                "Drop group_size (rows = machines) or use transport='collective'."
            )
        self._check_shard_weight_update()

    def _check_shard_weight_update(self):
        if not isinstance(self.shard_weight_update, bool):
            raise TypeError(
                "`shard_weight_update` must be True or False. Received: "
                f"shard_weight_update={self.shard_weight_update!r}."
            )

    def resolved_bucket_mb(self) -> float:
        """`bucket_mb`, or the tuned 16 MB if `None`.

        The gradient all-reduce and the sharded update size their buckets with
        `Transport.bucket_bytes`, which on the socket ring takes 64 MB instead
        where the transport's calls cannot overlap the backward pass.
        """
        return DEFAULT_BUCKET_MB if self.bucket_mb is None else float(self.bucket_mb)

    def resolved_bucket_bytes(self) -> float:
        """`resolved_bucket_mb()` in bytes (1 MB = 1e6 bytes), for bucket planning."""
        return self.resolved_bucket_mb() * 1e6


def validate(all_reduce) -> AllReduceOptions:
    """Returns `all_reduce` as options (`None` gives the defaults); checks its type."""
    if all_reduce is None:
        return AllReduceOptions()
    if not isinstance(all_reduce, AllReduceOptions):
        raise TypeError(
            "`all_reduce` must be a `keras_replicator.AllReduceOptions` or None. "
            f"Received: all_reduce={all_reduce!r}. Use e.g. "
            "all_reduce=kr.AllReduceOptions(compression='bf16')."
        )
    return all_reduce
