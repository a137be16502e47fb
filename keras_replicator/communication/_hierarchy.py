"""Hierarchical gradient all-reduce over a grid of replicas, on native sub-groups.

The replicas form the grid of `_grid`, the one 2-D design the socket ring's rows
and columns (`ring/_hierarchical`) follow too: a *row* is ``group_size``
consecutive replicas (by default the devices of one worker, whose links are fast:
NVLink, PCIe, shared memory), a *column* holds the replicas at the same position
of every row (one per worker: the slow network). Replica ``g`` sits in row
``g // k`` and column ``g % k``; with ``R`` replicas there are ``R // k`` rows.
This module is that design on TensorFlow's sub-group collectives:

* ``"local_then_global"`` (Jia et al. 2018): all-reduce along the row, then only
  the row's first replica (its *leader*) all-reduces along column 0 with the
  other leaders, then the leader broadcasts to its row. Only one replica per
  worker talks over the network, with the full buffer.
* ``"2d"`` (Ying et al. 2018): reduce-scatter along the row (position ``c``
  keeps the ``c``-th ``1/k`` of the row's sum), all-reduce that slice along
  column ``c``, all-gather along the row. Every replica talks over the network,
  each with ``1/k`` of the buffer, in ``k`` parallel column all-reduces.

Why native sub-group collectives, not `keras_replicator.replica`'s grouped
ones: those are exact everywhere but are built from one all-gather of every
replica's value (``R`` times the traffic), which defeats the purpose for
gradients. TensorFlow's collective ops (`tf.raw_ops.CollectiveReduceV2`,
`CollectiveReduceScatterV2`, `CollectiveGatherV2`, `CollectiveBcastSendV2` /
`RecvV2`) take their own ``group_size`` / ``group_key`` / ``instance_key``, so
any sub-group of devices is a group of its own: the stock strategy uses the same
ops for its flat all-reduce. They run on `MultiDeviceReplicator` (a
`MirroredStrategy`) and `MultiWorkerReplicator` (`MultiWorkerMirroredStrategy`)
on CPUs and GPUs; this module uses them for every step. Three details make them
safe to call from a replica:

* **Keys.** A group key per row and per column, offset from the strategy's
  own collective key base (so two strategies never share a group). Instance
  keys come from a per-strategy counter that every replica advances in the same
  program order, so the replicas of one collective agree without a `merge_call`;
  workers agree because they trace the same functions in the same order (the
  scheme TensorFlow's own strategies used before call-time instance keys).
* **Order.** Each device passes one resource handle as ``ordering_token``, so
  TensorFlow's automatic control dependencies order the collectives *per
  device* (without a token it chains every collective of every replica into one
  sequence, and replica 0's first collective waits forever for replica 1's).
* **NCCL on GPUs.** A collective placed on a GPU carries
  ``communication_hint="nccl"`` (`_platform.nccl_usable`): TensorFlow runs
  NCCL only when asked (``"auto"`` gives a GPU collective the RING
  implementation, and reduce-scatter no implementation at all:
  `collective_param_resolver_local.cc`, ``AssignCollectiveType``). Elsewhere
  ``"auto"``: TensorFlow's ring.
* **Ranks.** A group ranks its members by task, then device (GPUs of one
  host possibly in the order of their interconnect, ``OrderTaskDeviceMap``,
  the same on identical hosts); row position ``c`` of every row has the same
  rank (same device suffix on every worker, or consecutive devices of one
  machine), which is what pairs slice ``c`` of reduce-scatter, column
  all-reduce and all-gather. The buffer is padded to a
  multiple of ``k`` for the scatter.

`reduce_scatter_over_replicas` is the same machinery on a grid of one row
(every replica): weight-update sharding's reduce-scatter on GPUs, where NCCL
moves ``1/N`` of the buffer to each replica instead of an all-reduce's bytes.
There the rank matters (replica ``r`` must keep row ``r``, the piece it
updates), and TensorFlow may rank a host's GPUs along their interconnect, not
by device number (``OrderTaskDeviceMap``); so the group first gathers its
members' replica ids in rank order (a few bytes) and each replica permutes its
rows to match.

Degenerate grids need no special case beyond skipping groups of one: with one
worker and the default rows, ``"local_then_global"`` and ``"2d"`` are a single
local all-reduce; with one device per worker, a single cross-worker all-reduce.
A ``group_size`` that does not divide the replicas is a `ValueError` at the
first step (the grid must be rectangular for the columns to exist).

On a TPU there is no hierarchy to choose: the TPU runtime already all-reduces
over its 2-D torus (Ying et al.'s scheme is how TPU pods work), and these ops
have no TPU kernels, so `TPUReplicator` rejects ``hierarchy``.

References:
    - Jia et al., 2018. Highly Scalable Deep Learning Training System with
      Mixed-Precision: Training ImageNet in Four Minutes.
    - Ying et al., 2018. Image Classification at Supercomputer Scale.
"""

from __future__ import annotations

import itertools
import weakref

import tensorflow as tf

from keras_replicator import _compat, _platform
from keras_replicator.communication._grid import Grid, chunk_size, grid

# Offset of our group keys from the strategy's collective key base; the stock
# strategy allocates a handful of keys from base + 1 (`_compat` strides bases by
# 100,000).
_GROUP_KEY_OFFSET = 60_000
_COLUMN_KEY_OFFSET = 20_000
# The one-row grid of `reduce_scatter_over_replicas`: a group of its own (the
# same devices as a hierarchy's row, but not the same group size).
_FLAT_KEY_OFFSET = 30_000


def row_size_of(strategy, group_size: int | None) -> int:
    """Replicas per row: `group_size`, or the replicas of one worker."""
    if group_size is not None:
        return group_size
    return len(strategy.extended.worker_devices)


def sum_over_replicas(
    value, hierarchy: str, group_size: int | None, timeout=None, *, keys
):
    """Sums a 1-D tensor over every replica by `hierarchy`; call in a replica.

    Args:
        value: A 1-D tensor of a dtype TensorFlow's collectives reduce.
        hierarchy: `"local_then_global"` or `"2d"`.
        group_size: Replicas per row, or `None` for the replicas of one worker.
        timeout: Seconds a collective waits for its peers (`None`: forever).
        keys: The strategy's `CollectiveKeys` (its transport's).

    Returns:
        The sum, identical on every replica.
    """
    context = tf.distribute.get_replica_context()
    if context.num_replicas_in_sync == 1:
        return value
    strategy = tf.distribute.get_strategy()
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    if replica is None:  # pragma: no cover - every strategy we support is static
        raise RuntimeError("A hierarchical all-reduce needs a static replica id.")
    position = grid(
        context.num_replicas_in_sync, row_size_of(strategy, group_size), int(replica)
    )
    ops = _Collectives(strategy, position, timeout, keys)
    if hierarchy == "local_then_global":
        total = _local_then_global(value, position, ops)
    elif hierarchy == "2d":
        total = _two_d(value, position, ops)
    else:  # pragma: no cover - `AllReduceOptions` validates the name
        raise ValueError(f"Unknown hierarchy {hierarchy!r}.")
    # The raw ops do not infer output shapes; buckets need static ones.
    total.set_shape(value.shape)
    return total


def reduce_scatter_over_replicas(matrix, timeout=None, *, keys):
    """Row `r` of an `[N, C]` matrix summed over the `N` replicas, on replica `r`.

    One NCCL reduce-scatter over every replica; for GPU replicas (TensorFlow
    has no CPU kernel for it). Call in a replica context.

    Args:
        matrix: This replica's `[N, C]` matrix, `N` the replicas in sync.
        timeout: Seconds a collective waits for its peers (`None`: forever).
        keys: The strategy's `CollectiveKeys` (its transport's).

    Returns:
        This replica's `[C]` row of the sum.
    """
    context = tf.distribute.get_replica_context()
    strategy = tf.distribute.get_strategy()
    replicas = context.num_replicas_in_sync
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    if replica is None:  # pragma: no cover - every strategy we support is static
        raise RuntimeError("A reduce-scatter needs a static replica id.")
    position = Grid(1, replicas, 0, int(replica))
    ops = _Collectives(strategy, position, timeout, keys, key_offset=_FLAT_KEY_OFFSET)
    # The group's rank k delivers position k of the buffer; put replica s's row
    # where replica s's rank is (exact: small integers in float32).
    ids = ops.row_all_gather(tf.constant([float(replica)], tf.float32))
    rows = tf.gather(matrix, tf.cast(ids, tf.int32))
    row = ops.row_reduce_scatter(tf.reshape(rows, [-1]))
    row.set_shape([matrix.shape[1]])
    return row


def _local_then_global(value, position: Grid, ops):
    total = ops.row_all_reduce(value)
    if position.rows == 1:
        return total
    if position.column == 0:
        total = ops.column_all_reduce(total)
    return ops.row_broadcast(total)


def _two_d(value, position: Grid, ops):
    k = position.row_size
    length = tf.shape(value)[0]
    padding = k * chunk_size(length, k) - length
    padded = tf.pad(value, [[0, padding]]) if k > 1 else value
    part = ops.row_reduce_scatter(padded)
    part = ops.column_all_reduce(part)
    return ops.row_all_gather(part)[:length]


class _Collectives:
    """One replica's native collectives along its row and its column."""

    def __init__(self, strategy, position: Grid, timeout, keys, key_offset: int = 0):
        self._state = keys
        self._strategy = strategy
        self._position = position
        self._timeout = 0.0 if timeout is None else float(timeout)
        # Replica ids are worker-major, so this replica's local device is:
        local = strategy.extended.worker_devices
        self._device = local[
            (position.row * position.row_size + position.column) % len(local)
        ]
        # NCCL on a GPU of its own; TensorFlow's RING on logical or shared
        # GPUs (NCCL refuses two ranks on one GPU) and on CPUs.
        self._nccl = _platform.device_platform(
            self._device
        ) == _platform.GPU and _platform.nccl_usable(strategy)
        base = getattr(strategy, "_collective_key_base", 0) + _GROUP_KEY_OFFSET
        self._row_key = base + key_offset + position.row
        self._column_key = base + _COLUMN_KEY_OFFSET + position.column

    def _token(self):
        # NCCL: on the strategy's own chain, so each device launches ours and
        # its collectives in one order (`_compat.collective_ordering_token`).
        if self._nccl:
            token = _compat.collective_ordering_token(self._strategy, self._device)
            if token is not None:
                return token
        return self._state.token(self._device)

    def _common(self, key):
        return dict(
            group_key=key,
            instance_key=self._state.next_instance_key(self._position, key),
            ordering_token=[self._token()],
            timeout_seconds=self._timeout,
            communication_hint="nccl" if self._nccl else "auto",
        )

    def row_all_reduce(self, x):
        if self._position.row_size == 1:
            return x
        return tf.raw_ops.CollectiveReduceV2(
            input=x,
            group_size=self._position.row_size,
            merge_op="Add",
            final_op="Id",
            **self._common(self._row_key),
        )

    def column_all_reduce(self, x):
        if self._position.rows == 1:
            return x
        return tf.raw_ops.CollectiveReduceV2(
            input=x,
            group_size=self._position.rows,
            merge_op="Add",
            final_op="Id",
            **self._common(self._column_key),
        )

    def row_reduce_scatter(self, x):
        """This replica's `1 / row_size` slice of the row's sum (`x` is padded)."""
        k = self._position.row_size
        if k == 1:
            return x
        if not self._nccl:
            # TensorFlow registers reduce-scatter for NCCL only ("did not find
            # collective implementation" on CPU or RING): sum the row, keep
            # our slice.
            total = self.row_all_reduce(x)
            return tf.split(total, k)[self._position.column]
        return tf.raw_ops.CollectiveReduceScatterV2(
            input=x,
            group_size=k,
            merge_op="Add",
            final_op="Id",
            **self._common(self._row_key),
        )

    def row_all_gather(self, x):
        if self._position.row_size == 1:
            return x
        return tf.raw_ops.CollectiveGatherV2(
            input=x, group_size=self._position.row_size, **self._common(self._row_key)
        )

    def row_broadcast(self, x):
        """The leader's `x` on every replica of the row."""
        if self._position.row_size == 1:
            return x
        # An all-reduce in which only the leader contributes: exact (adding
        # zeros), and ordered by the same token as every other collective,
        # which the send/receive broadcast ops cannot be.
        if self._position.column != 0:
            x = tf.zeros_like(x)
        return self.row_all_reduce(x)


class CollectiveKeys:
    """Per strategy: instance-key counters per replica and ordering tokens.

    Held by the strategy's transport (`Transport.collective_keys`), so every
    collective made for one strategy draws from one sequence per group.
    """

    def __init__(self):
        self._counters: dict = {}
        self._tokens: dict = {}
        self._per_graph: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def next_instance_key(self, position: Grid, group_key: int) -> int:
        # Per replica and group: the members of a group issue the same sequence
        # of its collectives, whatever else each of them issues in between.
        key = (position.row, position.column, group_key)
        counter = self._counters.setdefault(key, itertools.count(1))
        return next(counter)

    def token(self, device: str):
        with tf.init_scope():
            # Eagerly (a `tf.function` step) one handle per device for good; a
            # step built in a plain `tf.Graph` (graph inspection) needs its own.
            graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
            tokens = self._tokens if graph is None else self._graph_tokens(graph)
            if device not in tokens:
                # An eager resource handle: captured once per function graph, so
                # all of one device's collectives in a graph share it.
                with tf.device(device):
                    tokens[device] = tf.raw_ops.VarHandleOp(
                        dtype=tf.float32,
                        shape=[],
                        shared_name=f"kr_hierarchy_{device}",
                    )
        return tokens[device]

    def _graph_tokens(self, graph) -> dict:
        return self._per_graph.setdefault(graph, {})
