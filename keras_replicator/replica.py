"""Collectives to call inside a replica: the MPI-like half of TF-Replicator.

Call these from code that runs once per replica: a Keras `train_step`, a layer's
`call` under a strategy, or a `step_fn` given to `strategy.run_steps`. Outside any
strategy they act as if there were one replica, so the same layer code runs on one
device; in cross-replica context (inside `strategy.scope()` but not in a step) they
raise `RuntimeError`.

Every function takes `group_size=k` to act within consecutive groups of `k`
replicas (replicas `0..k-1` form group 0, and so on); `source`, the receiving index
`i` and the count `n` in the descriptions below are then positions within the group.

How each backend runs them (why: TensorFlow's `ReplicaContext` offers only
`all_reduce` (sum, mean) and `all_gather`, and its raw sub-group, broadcast,
all-to-all and permute ops either lack CPU kernels or deadlock without per-replica
ordering tokens):

* `all_reduce` over all replicas with "sum" / "mean" uses the strategy's native
  all-reduce on every backend (NCCL / ring on GPUs and CPUs, gRPC across workers,
  the TPU interconnect on TPUs).
* A collective must be called by every replica (same count, same order). A call
  inside a replica-dependent `tf.cond` raises at trace time on one machine; across
  workers, a peer that never arrives fails the call after the strategy's collective
  timeout ("Collective has timed out waiting for other workers").
* Everything else, and every grouped call, is composed from one native `all_gather`
  of the value followed by local selection and arithmetic. That is exact and
  differentiable on MultiDeviceReplicator, MultiWorkerReplicator and TPUReplicator,
  and costs `num_replicas` times the value's size in traffic: right for statistics
  and small tensors (batch-norm moments, GAN feature statistics), not for gradients.

Example:
>>> import tensorflow as tf
>>> from keras_replicator import replica
>>> int(replica.num_replicas()), float(replica.all_reduce(tf.constant(3.0)))
(1, 3.0)
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator import _compat

_OPS = ("sum", "mean", "max", "min")


class _ShapeOnlyContext:
    """Stands in for a replica while Keras infers a functional model's shapes.

    Every replica is taken to hold the same value, which gives every collective its
    true output shape; no values are computed there.
    """

    replica_id_in_sync_group = 0

    def __init__(self):
        self.num_replicas_in_sync = tf.distribute.get_strategy().num_replicas_in_sync

    def all_gather(self, value, axis):
        return tf.concat([value] * self.num_replicas_in_sync, axis=axis)

    def all_reduce(self, reduce_op, value):
        return value


def _context(function_name: str) -> tf.distribute.ReplicaContext:
    context = tf.distribute.get_replica_context()
    if context is None and _compat.in_keras_symbolic_build():
        return _ShapeOnlyContext()
    if context is None:
        raise RuntimeError(
            f"`keras_replicator.replica.{function_name}` must be called inside a "
            "replica: in a Keras `train_step` / `test_step`, a layer's `call`, or a "
            "`step_fn` run by `strategy.run_steps` or `strategy.run`. It was called "
            "in cross-replica context (inside `strategy.scope()` but outside a "
            "step). Move the call into the step function."
        )
    return context


def replica_id() -> tf.Tensor:
    """This replica's index in `[0, num_replicas())`, as an int32 scalar tensor."""
    return tf.cast(_context("replica_id").replica_id_in_sync_group, tf.int32)


def num_replicas() -> int:
    """The number of replicas computing in sync (1 outside any strategy)."""
    return _context("num_replicas").num_replicas_in_sync


def _group(function_name: str, group_size: int | None) -> tuple[int, int]:
    """Returns `(n, k)`: replicas in all, replicas per group; validates `k`."""
    n = _context(function_name).num_replicas_in_sync
    if group_size is None:
        return n, n
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(
            f"`group_size` must be an integer or None. Received: "
            f"group_size={group_size!r}."
        )
    if group_size < 1 or n % group_size:
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        raise ValueError(
            f"`group_size` must divide the {n} replicas. Received: "
            f"group_size={group_size}. Use one of {divisors}, or None for all."
        )
    return n, group_size


def _reduce_op(op) -> str:
    if isinstance(op, tf.distribute.ReduceOp):
        return op.value.lower()
    if op not in _OPS:
        raise ValueError(
            f"`op` must be one of {list(_OPS)} or a tf.distribute.ReduceOp. "
            f"Received: op={op!r}."
        )
    return op


def _gather_rows(function_name: str, x) -> tf.Tensor:
    """Every replica's `x`, stacked on a new leading axis: shape `[n, *x.shape]`."""
    x = tf.convert_to_tensor(x)
    context = _context(function_name)
    if context.num_replicas_in_sync == 1:
        return tf.expand_dims(x, 0)
    if x.dtype == tf.bool:
        return tf.cast(_gather_rows(function_name, tf.cast(x, tf.int32)), tf.bool)
    if x.dtype == tf.bfloat16:  # no bfloat16 kernel for gathers; float32 is exact
        wide = _gather_rows(function_name, tf.cast(x, tf.float32))
        return tf.cast(wide, tf.bfloat16)
    return _native(
        function_name, lambda: context.all_gather(tf.expand_dims(x, 0), axis=0)
    )


def _my_group_rows(function_name: str, x, n: int, k: int) -> tf.Tensor:
    """The rows of this replica's group: shape `[k, *x.shape]`."""
    rows = _gather_rows(function_name, x)
    if k == n:
        return rows
    grouped = tf.reshape(rows, tf.concat([[n // k, k], tf.shape(rows)[1:]], axis=0))
    return tf.gather(grouped, replica_id() // k)


def _native(function_name: str, call):
    """Runs a native collective; explains the error of a replica-dependent branch."""
    try:
        return call()
    except RuntimeError as error:
        if "merge_call" not in str(error):
            raise
        raise RuntimeError(
            f"`keras_replicator.replica.{function_name}` must be called by every "
            "replica, the same number of times and in the same order. It was called "
            "inside a branch or loop that depends on the replica (e.g. `tf.cond` on "
            "`replica_id()`), where some replicas would skip it and the others would "
            "wait forever. Call it unconditionally and select the result instead "
            "(e.g. `tf.where(replica_id() == 0, reduced, x)`). It also cannot run "
            "inside a nested `tf.function`, such as the XLA-compiled forward pass of "
            "`model.compile(jit_compile=True)`: models with cross-replica layers "
            "(`SyncBatchNormalization`) need `jit_compile=False`."
        ) from error


def _position(k: int) -> tf.Tensor:
    return replica_id() % k


def _reduce_rows(rows, op):
    reducers = {
        "sum": tf.reduce_sum,
        "mean": tf.reduce_mean,
        "max": tf.reduce_max,
        "min": tf.reduce_min,
    }
    return reducers[op](rows, axis=0)


def all_reduce(x, op="sum", *, group_size: int | None = None) -> tf.Tensor:
    """Reduces `x` over all replicas (or over this replica's group).

    Args:
        x: A tensor with the same shape on every replica.
        op: "sum", "mean", "max", "min" or a `tf.distribute.ReduceOp`.
            Defaults to `"sum"`.
        group_size: Reduce within consecutive groups of this many replicas.
            Defaults to `None` (all replicas).

    Returns:
        The reduced tensor, identical on the replicas of a group.
    """
    op = _reduce_op(op)
    n, k = _group("all_reduce", group_size)
    x = tf.convert_to_tensor(x)
    if k == n and op in ("sum", "mean") and n > 1:
        reduce_op = (
            tf.distribute.ReduceOp.SUM if op == "sum" else tf.distribute.ReduceOp.MEAN
        )
        context = _context("all_reduce")
        return _native("all_reduce", lambda: context.all_reduce(reduce_op, x))
    return _reduce_rows(_my_group_rows("all_reduce", x, n, k), op)


def all_gather(x, axis: int = 0, *, group_size: int | None = None) -> tf.Tensor:
    """Concatenates every replica's `x` (of its group) along `axis`, in replica order.

    Args:
        x: A tensor of at least one dimension, with the same shape on every
            replica (the native gather requires equal shapes).
        axis: The axis to concatenate along. Defaults to `0`.
        group_size: Gather within consecutive groups of this many replicas.
            Defaults to `None` (all replicas).

    Returns:
        A tensor whose `axis` is `k` times longer.
    """
    n, k = _group("all_gather", group_size)
    x = tf.convert_to_tensor(x)
    if x.shape.rank == 0:
        raise ValueError(
            "`x` must have at least one dimension to be gathered along `axis`. "
            "Received: a scalar. Use `tf.reshape(x, [1])`."
        )
    rows = _my_group_rows("all_gather", x, n, k)
    return tf.concat(tf.unstack(rows, num=k, axis=0), axis=axis)


def broadcast(x, source: int = 0, *, group_size: int | None = None) -> tf.Tensor:
    """Every replica (of a group) receives the value of replica `source`.

    Args:
        x: A tensor with the same shape on every replica.
        source: Index (within the group) of the replica whose value is sent.
            Defaults to `0`.
        group_size: Broadcast within consecutive groups of this many replicas.
            Defaults to `None` (all replicas).

    Returns:
        `source`'s `x`.
    """
    n, k = _group("broadcast", group_size)
    if isinstance(source, bool) or not isinstance(source, int) or not 0 <= source < k:
        raise ValueError(
            f"`source` must be a replica index in [0, {k}). "
            f"Received: source={source!r}."
        )
    return _my_group_rows("broadcast", x, n, k)[source]


def reduce_scatter(x, op="sum", axis: int = 0, *, group_size: int | None = None):
    """Reduces `x`, then replica `i` keeps the `i`-th of `n` equal slices along `axis`.

    Args:
        x: A tensor whose `axis` length is divisible by the number of replicas
            (of the group).
        op: As for `all_reduce`. Defaults to `"sum"`.
        axis: The axis to slice. Defaults to `0`.
        group_size: As for `all_reduce`. Defaults to `None`.

    Returns:
        This replica's slice of the reduced tensor.
    """
    n, k = _group("reduce_scatter", group_size)
    x = tf.convert_to_tensor(x)
    length = x.shape[axis]
    if length is not None and length % k:
        raise ValueError(
            f"`x` must split into {k} equal slices along axis {axis}. Received: "
            f"shape {x.shape}. Pad axis {axis} to a multiple of {k}."
        )
    reduced = all_reduce(x, op, group_size=group_size)
    return tf.gather(tf.stack(tf.split(reduced, k, axis=axis)), _position(k))


def all_to_all(x, split_axis: int = 0, concat_axis: int = 0, *, group_size=None):
    """Replica `i` receives the `i`-th slice of every replica's `x`, concatenated.

    `x` is split into `n` equal slices along `split_axis`; replica `i` gets slice
    `i` from each replica `j`, concatenated along `concat_axis` in `j` order.

    Args:
        x: A tensor whose `split_axis` length is divisible by the group size.
        split_axis: Axis to split. Defaults to `0`.
        concat_axis: Axis to concatenate the received slices on. Defaults to `0`.
        group_size: Exchange within consecutive groups. Defaults to `None`.

    Returns:
        The received slices, concatenated.
    """
    n, k = _group("all_to_all", group_size)
    x = tf.convert_to_tensor(x)
    length = x.shape[split_axis]
    if length is not None and length % k:
        raise ValueError(
            f"`x` must split into {k} equal slices along split_axis={split_axis}. "
            f"Received: shape {x.shape}."
        )
    rows = _my_group_rows("all_to_all", x, n, k)
    position = _position(k)
    received = [
        tf.gather(tf.stack(tf.split(rows[j], k, axis=split_axis)), position)
        for j in range(k)
    ]
    return tf.concat(received, axis=concat_axis)


def permute(x, shift: int = 1, *, group_size: int | None = None) -> tf.Tensor:
    """Ring exchange: replica `i` receives the value of replica `(i - shift) mod n`.

    Args:
        x: A tensor with the same shape on every replica.
        shift: How far values move round the ring. Defaults to `1`.
        group_size: Rings of consecutive groups of this many replicas.
            Defaults to `None` (one ring of all replicas).

    Returns:
        The value of replica `(i - shift) mod n`.
    """
    n, k = _group("permute", group_size)
    if isinstance(shift, bool) or not isinstance(shift, int):
        raise TypeError(f"`shift` must be an integer. Received: shift={shift!r}.")
    rows = _my_group_rows("permute", x, n, k)
    return tf.gather(rows, (_position(k) - shift) % k)


__all__ = [
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "num_replicas",
    "permute",
    "reduce_scatter",
    "replica_id",
]
