"""How the socket ring opens: its port, the table every worker shares, the fallback.

`SocketRing.connect` (`_socket_ring`) runs these on every worker: each binds a
port on its `TF_CONFIG` address (`listen`), the rows (address, port, random words,
a problem flag) are exchanged with one all-reduce of the strategy (`share`), and a
worker's problem (`flag`) makes every worker give up together (`failed`,
`give_up`): raise, or fall back to TensorFlow's collectives with a warning.
"""

from __future__ import annotations

import socket
import warnings

import tensorflow as tf

AUTO_CONNECT_TIMEOUT = 10.0


def listen(strategy):
    """Binds a listening socket on this worker's `TF_CONFIG` address.

    Returns `(server, [a, b, c, d, port], problem)`; `server` is None and `problem`
    a description if this worker cannot listen (an unresolvable or non-IPv4
    address, an address not on this machine).
    """
    resolver = strategy.cluster_resolver
    address = resolver.cluster_spec().task_address(resolver.task_type, resolver.task_id)
    try:
        host = socket.gethostbyname(address.rsplit(":", 1)[0])
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            server.bind((host, 0))
            server.listen(8)  # strangers may queue ahead of the neighbour
        except OSError:
            server.close()
            raise
    except OSError as error:
        return None, [0.0] * 5, f"cannot listen on {address!r}: {error}"
    port = server.getsockname()[1]
    return server, [float(int(part)) for part in host.split(".")] + [float(port)], None


def share(strategy, row):
    """All workers' `row`s as a table (one all-reduce), and this worker's rank."""
    size = strategy.num_replicas_in_sync

    def exchange():
        context = tf.distribute.get_replica_context()
        rank = context.replica_id_in_sync_group
        mine = tf.one_hot(rank, size)[:, None] * tf.constant([row])
        return context.all_reduce("sum", mine), rank

    table, rank = strategy.run(exchange)
    table = strategy.experimental_local_results(table)[0].numpy()
    return table, int(strategy.experimental_local_results(rank)[0])


def flag(problem) -> float:
    """1.0 if this worker had a problem: the last column of a shared row."""
    return 0.0 if problem is None else 1.0


def failed(table) -> list[int]:
    """The workers whose shared row ends with a problem flag."""
    return [rank for rank, row in enumerate(table) if row[-1] != 0.0]


def give_up(required: bool, failed, problem) -> None:
    mine = f" Here: {problem}." if problem else ""
    message = (
        f"The socket ring could not be opened on worker(s) {failed}.{mine} It needs "
        "each worker's TF_CONFIG address to be an IPv4 address of that machine, and "
        "TCP between workers on any port."
    )
    if required:
        raise RuntimeError(
            message + " Use kr.AllReduceOptions(transport='collective') (or None) "
            "instead."
        )
    warnings.warn(message + " Using TensorFlow's collectives instead.", stacklevel=3)
    return None
