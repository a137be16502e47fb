"""tf.distribute internals: which strategies are ours, collective keys, worker count,
per-device assignment from a replica context, the coordination service's barrier.

No public TensorFlow API says whether a strategy spans several workers, nor lets two
MirroredStrategies in one process use different collective groups; see each function.
"""

from __future__ import annotations

import inspect
import itertools

import tensorflow as tf

_collective_key_bases = itertools.count(start=1)
_COLLECTIVE_KEY_STRIDE = 100_000


def is_replicator(strategy) -> bool:
    """Whether `strategy` is one of our synchronous strategies.

    Read from the class, where `ReplicatorMixin` declares the marker (this leaf
    cannot import `keras_replicator._replicator_state`); nothing is set on an
    instance, and an instance attribute cannot fake it.
    """
    return getattr(type(strategy), "_kr_is_replicator", False)


def is_replicator_current() -> bool:
    """Whether the current (scope or replica context) strategy is one of ours."""
    return is_replicator(tf.distribute.get_strategy())


def next_collective_key_base() -> int:
    """A process-unique base for a new strategy's collective group/instance keys.

    TF gives every MirroredStrategy the same collective group key (1), so a second
    strategy over a different device set joins the first one's group and the first
    all-reduce aborts ("joining a group with size 4, but that group has size 2").
    `_collective_key_base` is TF's own knob for this (mirrored_strategy.py, "only set
    this in tests"). Workers build strategies in the same order, so the bases agree
    across workers.
    """
    return next(_collective_key_bases) * _COLLECTIVE_KEY_STRIDE


def stock_mirrored_strategy(devices):
    """A stock `tf.distribute.MirroredStrategy` with collective keys of its own.

    Every stock MirroredStrategy starts at group key 1 and instance key 100, so two
    in one process that all-reduce different dtypes at the same instance key abort
    every later collective of the process ("Collective instance 100 expected type 0
    and data_type 2 but got type 0 and data_type 1"). For tests that compare
    against stock in one process; `_collective_key_base` must be set before the
    constructor reads it, as our strategies do (`next_collective_key_base`).
    """
    strategy = tf.distribute.MirroredStrategy.__new__(tf.distribute.MirroredStrategy)
    strategy._collective_key_base = next_collective_key_base()
    strategy.__init__(devices)
    return strategy


def in_multi_worker_mode(strategy) -> bool:
    """Whether `strategy` spans several workers (no public API says so)."""
    return strategy.extended._in_multi_worker_mode()


def assign_in_every_replica(strategy, targets, values) -> None:
    """Assigns `values` (one per replica, replica context) to `targets`.

    TF's `tf.__internal__.distribute.interim.maybe_merge_call` (what Keras'
    TF optimizer uses; it skips the merge under strategies that support
    no-merge-call updates; `tf.distribute` has no public equivalent), then
    `extended.update` per variable, as Keras' `_distributed_tf_update_step`
    assigns: each device's copy gets its own replica's value. Used by
    whole-list optimizers and the sharded update.
    """

    def assign_all(distribution, targets, values):
        for target, value in zip(targets, values):
            distribution.extended.update(target, _assign, args=(value,), group=False)

    tf.__internal__.distribute.interim.maybe_merge_call(
        assign_all, strategy, targets, values
    )


def _assign(variable, value):
    return variable.assign(tf.cast(value, variable.dtype))


def wait_for_every_worker(barrier_id: str, timeout_seconds: float) -> None:
    """Blocks until every task of the cluster reaches `barrier_id`.

    TensorFlow's coordination service (started by every
    `MultiWorkerMirroredStrategy`) has barriers, reached through the eager
    context's `wait_at_barrier`; `tf.distribute` exposes none. Used so that
    workers leave together and the service does not report the first to exit
    as crashed (tensorflow/tensorflow#58434).
    """
    from tensorflow.python.eager import context

    context.context().wait_at_barrier(barrier_id, int(timeout_seconds * 1000))


def collective_ordering_token(strategy, device: str):
    """The ordering token of `strategy`'s own collectives on `device`, or None.

    NCCL needs every device to launch its collectives in one order, which
    TensorFlow gets from one resource handle per device passed as each
    collective's `ordering_token` (automatic control dependencies chain the ops
    that share it: cross_device_ops.py, "the lack of mechanism to order NCCL
    operations deterministically"). Our native NCCL collectives
    (`communication/_hierarchy`) must join that chain, or a device could
    launch ours and the strategy's in different orders and the ranks wait for
    each other. The handle lives in `CollectiveAllReduce._launchers` (one
    `CollectiveReplicaLauncher` per device); no public API exposes it. None in
    a TF1-style graph (TensorFlow then orders by control inputs) or where the
    strategy's cross-device ops are not `CollectiveAllReduce`.
    """
    from tensorflow.python.distribute import cross_device_ops, device_util

    extended = strategy.extended
    for name in ("_collective_ops", "_cross_device_ops"):
        ops = getattr(extended, name, None)
        if isinstance(ops, cross_device_ops.CollectiveAllReduce):
            break
    else:
        return None
    wanted = tf.DeviceSpec.from_string(device_util.canonicalize(device))
    for own, launcher in zip(ops._devices, ops._launchers):
        spec = tf.DeviceSpec.from_string(own)
        if (spec.device_type, spec.device_index) == (
            wanted.device_type,
            wanted.device_index,
        ):
            return launcher._get_ordering_token()
    return None


def check_upstream() -> dict[str, str]:
    """{name: what changed} for the tf.distribute internals read here."""
    changed = {}
    from tensorflow.python.eager import context

    barrier = getattr(context.Context, "wait_at_barrier", None)
    if not callable(barrier) or list(inspect.signature(barrier).parameters) != [
        "self",
        "barrier_id",
        "timeout_in_ms",
    ]:
        changed["Context.wait_at_barrier"] = "missing or its signature changed"
    interim = getattr(tf.__internal__.distribute, "interim", None)
    if not callable(getattr(interim, "maybe_merge_call", None)):
        changed["tf.__internal__.distribute.interim.maybe_merge_call"] = "missing"
    from tensorflow.python.distribute import (
        collective_all_reduce_strategy,
        mirrored_strategy,
    )

    for module in (mirrored_strategy, collective_all_reduce_strategy):
        if "container_strategy._collective_key_base" not in inspect.getsource(module):
            changed[module.__name__] = "no longer reads `_collective_key_base`"
    from tensorflow.python.distribute import cross_device_ops, cross_device_utils

    launcher = cross_device_utils.CollectiveReplicaLauncher
    if not callable(getattr(launcher, "_get_ordering_token", None)):
        changed["CollectiveReplicaLauncher._get_ordering_token"] = "missing"
    source = inspect.getsource(cross_device_ops.CollectiveAllReduce.__init__)
    for attribute in ("self._launchers", "self._devices"):
        if attribute not in source:
            changed[f"CollectiveAllReduce.{attribute[5:]}"] = "no longer set"
    extended = mirrored_strategy.MirroredExtended
    if not callable(getattr(extended, "_in_multi_worker_mode", None)):
        changed["MirroredExtended._in_multi_worker_mode"] = "missing"
    return changed
