"""How the socket ring opens: its port, the table every worker shares, the fallback.

`SocketRing.connect` (`_socket_ring`) runs these on every worker: each binds a
port on its `TF_CONFIG` address (`listen`), the rows (address, port, random words,
a problem flag) are exchanged with one all-reduce of the strategy (`share`), each
worker connects to the next and accepts the previous (`open_ring`), and a worker's
problem (`flag`) makes every worker give up together (`failed`, `give_up`): raise,
or fall back to TensorFlow's collectives with a warning.

Both connections must prove the job's secret, which the shared table carries
(`_handshake`: the listener serves every connection at once, so strangers on
the port delay no one; issue 34).

The ring's order follows the machines, not `TF_CONFIG`'s list (issue 37): each
row carries this worker's machine (`machine_key`), and `ring_order` puts the
workers of one machine next to each other, so each machine is entered and left
once. With workers listed h1, h2, h1, h2 (as schedulers may list them) the
TF_CONFIG order would cross machines on every link and share memory on none.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import warnings

import tensorflow as tf

from keras_replicator.communication.ring import _handshake

AUTO_CONNECT_TIMEOUT = 10.0
ACCEPT_GRACE = 5.0  # seconds accepting waits longer than connecting
BACKLOG = 128  # the kernel's queue of connections not yet accepted


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
            server.listen(BACKLOG)  # strangers may queue ahead of the neighbour
        except OSError:
            server.close()
            raise
    except OSError as error:
        return None, [0.0] * 5, f"cannot listen on {address!r}: {error}"
    port = server.getsockname()[1]
    return server, [float(int(part)) for part in host.split(".")] + [float(port)], None


def machine_key() -> list[float]:
    """Two floats naming where this worker runs, equal for workers that can share
    memory: the same kernel boot, network namespace (the shared-memory handover's
    abstract Unix sockets live there) and pid namespace (its peer check compares
    pids). Each is 24 bits of a hash, so exact in the float32 table.

    Example:
    >>> key = machine_key()
    >>> key == machine_key() and len(key) == 2 and all(0 <= k < 2**24 for k in key)
    True
    """
    parts = []
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            parts.append(file.read().strip())
    except OSError:  # not Linux: the host name will have to do
        parts.append(socket.gethostname())
    for namespace in ("net", "pid"):
        try:
            parts.append(str(os.stat(f"/proc/self/ns/{namespace}").st_ino))
        except OSError:
            parts.append("")
    digest = hashlib.blake2b("/".join(parts).encode(), digest_size=6).digest()
    return [
        float(int.from_bytes(digest[:3], "big")),
        float(int.from_bytes(digest[3:], "big")),
    ]


def ring_order(machines) -> list[int]:
    """The workers (ranks) in ring order: grouped by machine, each group in rank
    order, the groups in the order of their first worker.

    Args:
        machines: Each worker's machine key (`machine_key`), in rank order.

    Returns:
        `order`: the worker at each ring position.

    Example:
    >>> ring_order([[1, 1], [2, 2], [1, 1], [2, 2]])  # h1, h2, h1, h2
    [0, 2, 1, 3]
    >>> ring_order([[5, 0], [5, 0], [7, 0]])  # already grouped: unchanged
    [0, 1, 2]
    """
    keys = [tuple(float(v) for v in key) for key in machines]
    first = {}
    for rank, key in enumerate(keys):
        first.setdefault(key, rank)
    return sorted(range(len(keys)), key=lambda rank: (first[keys[rank]], rank))


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


def executor_threads() -> int:
    """The inter-op threads TensorFlow runs a step's ops on in this process.

    `tf.config.threading.set_inter_op_parallelism_threads(n)` sets it; 0 (not
    set) lets TensorFlow pick one per core this process may run on.

    Example:
    >>> executor_threads() >= 1
    True
    """
    threads = tf.config.threading.get_inter_op_parallelism_threads()
    if threads > 0:
        return threads
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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
    if problem and _handshake.STRANGERS in problem:
        message += (
            " Connections that do not prove the job's secret come from outside the "
            "job (a port scanner, another job): admit only the job's hosts to its "
            "ports."
        )
    if required:
        raise RuntimeError(
            message + " Use kr.AllReduceOptions(transport='collective') (or None) "
            "instead."
        )
    warnings.warn(message + " Using TensorFlow's collectives instead.", stacklevel=3)
    return None


# ------------------------------------------------------------------- the connections
def open_ring(server, right, secret: bytes, rank: int, size: int, wait: float):
    """Connects to worker `rank + 1` and accepts worker `rank - 1`, both proven.

    Accepting runs in a thread: each side's handshake needs its peer to answer,
    and every worker connects at the same time. The left neighbour may start a
    little later, so accepting waits `ACCEPT_GRACE` more than connecting.

    Args:
        server: This worker's listening socket.
        right: Worker `rank + 1`'s row of the shared table: IPv4 address, port.
        secret: The job's secret (`_handshake.derive_secret`).
        rank: This worker's place in the ring.
        size: The number of workers.
        wait: Seconds connecting may take.

    Returns:
        `(send, receive)`, the connected sockets.
    """
    accepted, accept_errors, refused = [], [], []
    deadline = time.monotonic() + wait + ACCEPT_GRACE
    left = (rank - 1) % size

    def accept():
        try:
            accepted.append(
                _handshake.accept_neighbour(
                    server, secret, rank, left, deadline, refused
                )
            )
        except (OSError, _handshake.HandshakeError) as error:
            accept_errors.append(error)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    send = None
    try:
        send = _connect_proven(right, secret, rank, size, wait, deadline)
    except BaseException as error:
        port = server.getsockname()[1]
        try:
            server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread up
        except OSError:
            pass
        thread.join()
        for s in accepted:
            s.close()
        if refused and isinstance(error, OSError):  # say what reached the port too
            meanwhile = _handshake.describe(refused, port)
            raise ConnectionError(
                f"{type(error).__name__}: {error}; meanwhile{meanwhile}"
            ) from error
        raise
    thread.join()
    if accept_errors:
        send.close()
        raise accept_errors[0]
    return send, accepted[0]


def _connect_proven(right, secret: bytes, rank: int, size: int, wait: float, deadline):
    """Connects to the right neighbour and proves the secret, within `wait`.

    Under a flood of strangers the neighbour's listener drops connections beyond
    `_handshake.MAX_PENDING` at random, ours among them: a connection closed
    before the proof completed is opened again until `wait` is used up (issue 34).
    """
    host = ".".join(str(int(v)) for v in right[:4])
    give_up_at = time.monotonic() + wait
    while True:
        left_to_wait = max(give_up_at - time.monotonic(), 0.01)
        send = socket.create_connection((host, int(right[4])), timeout=left_to_wait)
        try:
            _handshake.prove_to_listener(
                send, secret, rank, (rank + 1) % size, deadline
            )
            return send
        except _handshake.HandshakeError:  # a listener without the secret: no retry
            send.close()
            raise
        except ConnectionError:  # closed before the proof: dropped, connect again
            send.close()
            if time.monotonic() + 0.05 >= give_up_at:
                raise
            time.sleep(0.05)
        except BaseException:
            send.close()
            raise
