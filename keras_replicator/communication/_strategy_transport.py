"""Which transport a strategy's replicas use: `transport_for(strategy)`.

Our strategies build their one `Transport` in their constructors and keep it in
their `ReplicatorState`; a stock strategy (a `tf.distribute.MirroredStrategy`
under `kr.wrap_optimizer`) gets a `CollectiveTransport` with the default options
on first use, kept beside it for its life. `options_of` reads the resolved
`kr.AllReduceOptions` back from it.

Example:
>>> import tensorflow as tf
>>> type(transport_for(tf.distribute.get_strategy())).__name__
'CollectiveTransport'
>>> options_of(tf.distribute.get_strategy()).bucket_mb is None
True
"""

from __future__ import annotations

import dataclasses
import threading
import weakref

from keras_replicator import _platform
from keras_replicator._replicator_state import replicator_state
from keras_replicator.communication import _compression
from keras_replicator.communication._collective_transport import CollectiveTransport
from keras_replicator.communication._transport import Transport
from keras_replicator.communication.options import AllReduceOptions

# A stock strategy's one transport (it has no `ReplicatorState` to hold it).
_STOCK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STOCK_LOCK = threading.Lock()


def options_of(strategy) -> AllReduceOptions:
    """The strategy's resolved all-reduce options; defaults for stock strategies."""
    state = replicator_state(strategy)
    if state is None or state.transport is None:
        return AllReduceOptions()
    return state.transport.options


def transport_for(strategy, options: AllReduceOptions | None = None):
    """`strategy`'s transport; for other `options`, one made for them.

    Our strategies build theirs in their constructors; a stock strategy (a
    `tf.distribute.MirroredStrategy` under `kr.wrap_optimizer`) gets one with the
    default options on first use, kept for its life. `options` that name another
    collective layout (a `hierarchy`, a `group_size`) get a collective transport
    of their own that shares the strategy's collective keys.

    Args:
        strategy: A `tf.distribute.Strategy`.
        options: All-reduce options other than the strategy's, or None.
            Defaults to `None`.

    Returns:
        A `Transport`.

    Raises:
        ValueError: `transport='socket'` on a strategy that opened no ring, or
            a `compression` the strategy's platform cannot sum.
    """
    own = _own_transport(strategy)
    if options is None or options == own.options:
        return own
    # Where a stock strategy's wire format meets its platform for the first
    # time (at trace time; our strategies check in their constructors).
    nccl = _platform.nccl_usable(strategy)
    _compression.check_wire_format(
        options.compression, _platform.platform_of(strategy), nccl=nccl
    )
    if options.transport == "socket":
        if own.options.transport != "socket":
            raise ValueError(
                "`transport='socket'` needs a `MultiWorkerReplicator` built "
                "with it: `kr.MultiWorkerReplicator(all_reduce="
                "kr.AllReduceOptions(transport='socket'))`. Received: "
                f"strategy={strategy!r}."
            )
        return own  # its `bucket_bytes(options)` and the compression follow them
    same_layout = own.options.transport == "collective" and (
        (options.hierarchy, options.group_size)
        == (own.options.hierarchy, own.options.group_size)
    )
    if same_layout:
        return own
    return _collective(options, own.collective_timeout, nccl, keys=own.collective_keys)


def ring_of(strategy):
    """The socket ring `strategy` sends its gradients through, or None.

    For what runs outside a replica context (gathering sharded optimizer
    slots to save them, `sharding/_saving`).
    """
    state = replicator_state(strategy)
    transport = None if state is None else state.transport
    return getattr(transport, "ring", None)


def _own_transport(strategy) -> Transport:
    state = replicator_state(strategy)
    if state is not None and state.transport is not None:
        return state.transport
    if state is not None:
        raise ValueError(
            "A parameter-server strategy has no all-reduce transport: its workers "
            "send gradients to the parameter servers. Received: "
            f"strategy={strategy!r}."
        )
    with _STOCK_LOCK:
        transport = _STOCK.get(strategy)
        if transport is None:
            options = dataclasses.replace(AllReduceOptions(), transport="collective")
            nccl = _platform.nccl_usable(strategy)
            platform = _platform.platform_of(strategy)
            _compression.check_wire_format(options.compression, platform, nccl=nccl)
            transport = _collective(options, None, nccl)
            _STOCK[strategy] = transport
        return transport


def _collective(options, timeout, nccl, keys=None) -> CollectiveTransport:
    return CollectiveTransport(options, timeout, nccl=nccl, keys=keys)
