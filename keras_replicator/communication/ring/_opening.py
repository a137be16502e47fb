"""How the socket ring opens on every worker: the flat ring, then its grid.

`SocketRing.connect` (`_socket_ring`) is this module's `connect`: each worker
listens (`_setup.listen`), the rows of the table every worker shares (address,
port, machine, whether it allows a grid, random words, a problem flag) are
exchanged with one all-reduce of the strategy, the ring is ordered by machine
(`_setup.ring_order`), each worker connects to the next and accepts the previous,
both proving the job's secret (`_handshake`), and hands its shared-memory
segment to its right neighbour (`_shared_memory`). A worker's problem makes every
worker give up together. On a grid of machines (unless
`KERAS_REPLICATOR_RING_HIERARCHY=0` on some worker), `open_grid` then opens each
worker's row and column rings (`_hierarchical`). The ring class is passed in,
so that nothing here imports `_socket_ring` back.
"""

from __future__ import annotations

import hashlib
import socket
import time
import warnings

from keras_replicator.communication import _grid
from keras_replicator.communication.ring import (
    _frames,
    _handshake,
    _hierarchical,
    _setup,
    _shared_memory,
)


def connect(
    ring_class, strategy, timeout: float, required=True, bucket_bytes=0, grid=None
):
    """`SocketRing.connect`, opening `ring_class` rings (see its docstring)."""
    size = strategy.num_replicas_in_sync
    server, row, problem = _setup.listen(strategy)
    grid_allowed = 0.0
    try:  # checked here, so that every worker decides alike
        _shared_memory.enabled()
        grid_allowed = float(_hierarchical.enabled())  # a bad value fails here
        if grid is not None:  # an `AllReduceOptions.hierarchy` asks for it
            grid_allowed = float(grid)
    except ValueError as error:
        problem = problem or str(error)
    # The ring follows the machines; rows and columns only if all allow them.
    # Its calls overlap the backward pass only if every worker has a thread for
    # them: a worker that plans buckets differently would send other buffers.
    overlaps = float(_setup.executor_threads() > 1)
    row = row + _setup.machine_key() + [grid_allowed, overlaps]
    words = _handshake.secret_words()
    table, rank = _setup.share(strategy, row + words + [_setup.flag(problem)])
    failed = _setup.failed(table)
    if failed:
        if server is not None:
            server.close()
        return _setup.give_up(required, failed, problem)
    secret = _handshake.derive_secret(table[:, len(row) : len(row) + len(words)])
    machines = table[:, len(row) - 4 : len(row) - 2]
    order = _setup.ring_order(machines)
    grid_allowed = bool(table[:, len(row) - 2].min())
    overlaps = bool(table[:, len(row) - 1].min())
    position = order.index(rank)  # the ring's own numbering from here on
    wait = timeout if required else min(timeout, _setup.AUTO_CONNECT_TIMEOUT)
    send = receive = None
    try:
        right = table[order[(position + 1) % size]]
        send, receive = _setup.open_ring(server, right, secret, position, size, wait)
    except (OSError, _handshake.HandshakeError) as error:
        problem = f"{type(error).__name__}: {error}"
    server.close()
    table, _ = _setup.share(strategy, [_setup.flag(problem)])
    failed = _setup.failed(table)
    if failed:
        for s in (send, receive):
            if s is not None:
                s.close()
        return _setup.give_up(required, failed, problem)
    _ready(send, receive, timeout)
    step = min(bucket_bytes, 64 * 2**20) // size + 64  # a chunk and the counts
    try:
        link = _shared_memory.open_link(send, receive, time.monotonic() + wait, step)
    except (OSError, ValueError) as error:  # a peer died in between
        _frames.shut_down(send, receive)
        raise RuntimeError(f"The socket ring could not open: {error}") from error
    ring = ring_class(position, size, send, receive, timeout, link, order)
    ring.overlaps = overlaps
    rows = _hierarchical.grid(order, machines) if grid_allowed else None
    if rows is None:
        return ring
    grid = open_grid(
        ring_class, strategy, ring, rows, secret, timeout, wait, bucket_bytes
    )
    return ring if grid is None else grid


def open_grid(
    ring_class, strategy, flat, rows, secret: bytes, timeout, wait, bucket_bytes=0
):
    """Opens this worker's row and column rings; call on every worker at once.

    Every worker listens twice (row, column), the ports are shared in one table
    all-reduce, each opens its row ring (with shared memory) and then its column
    ring (sockets), each with its own secret derived from the job's, and the
    workers agree (one more all-reduce) on whether every one succeeded.

    Args:
        ring_class: `SocketRing`, for each row and column.
        strategy: The `MultiWorkerReplicator` being built.
        flat: This worker's flat `SocketRing`, already open.
        rows: ``_hierarchical.grid(flat.order, machines)``.
        secret: The job's secret.
        timeout: Seconds a ring call may take.
        wait: Seconds opening may take.
        bucket_bytes: The largest buffer expected, to size shared memory.

    Returns:
        A `_hierarchical.HierarchicalRing`, or None if some worker could not
        open its rings (with a warning: the flat ring stays, correct).
    """
    machines, per_machine = len(rows), len(rows[0])
    # Positions are ordered by machine, so this worker's place is `_grid`'s.
    position = _grid.grid(machines * per_machine, per_machine, flat.rank)
    machine, local = position.row, position.column
    if rows[machine][local] != flat.rank:  # pragma: no cover - `grid` groups them
        raise RuntimeError(f"The ring's rows {rows} are not ordered by machine.")
    servers, columns, problem = [], [], None
    for _ in ("row", "column"):
        server, address, trouble = _setup.listen(strategy)
        servers.append(server)
        columns += address
        problem = problem or trouble
    table, _ = _setup.share(strategy, columns + [_setup.flag(problem)])
    rings: list = []
    if not _setup.failed(table):
        try:
            for kind, (members, index) in enumerate(
                ((rows[machine], local), ([row[local] for row in rows], machine))
            ):
                size = len(members)
                right = flat.order[members[(index + 1) % size]]
                send, receive = _setup.open_ring(
                    servers[kind],
                    table[right][5 * kind : 5 * kind + 5],
                    _sub_secret(secret, kind),
                    index,
                    size,
                    wait,
                )
                _ready(send, receive, timeout)
                link = None
                if kind == 0:  # one machine: its payloads through shared memory
                    step = min(bucket_bytes, 64 * 2**20) // per_machine + 64
                    deadline = time.monotonic() + wait
                    link = _shared_memory.open_link(send, receive, deadline, step)
                rings.append(ring_class(index, size, send, receive, timeout, link))
        except (OSError, ValueError) as error:  # incl. a failed handshake
            problem = f"{type(error).__name__}: {error}"
    for server in servers:
        if server is not None:
            server.close()
    table, _ = _setup.share(strategy, [_setup.flag(problem)])
    failed = _setup.failed(table)
    if failed or len(rings) != 2:
        for ring in rings:
            ring._fail(RuntimeError("the rows and columns did not open everywhere"))
        warnings.warn(
            f"The socket ring's rows and columns ({machines} machines x "
            f"{per_machine} workers) could not be opened on worker(s) {failed}"
            f"{'; here: ' + problem if problem else ''}. The flat ring stays: "
            "correct, and slower between machines.",
            stacklevel=3,
        )
        return None
    return _hierarchical.HierarchicalRing(flat, *rings)


def _ready(send, receive, timeout) -> None:
    """Each small message leaves at once (no Nagle: a header waiting on the
    peer's delayed ACK stalled the grid's columns 40 ms a call), and no socket
    call outlives the ring's timeout."""
    for s in (send, receive):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(timeout)


def _sub_secret(secret: bytes, kind: int) -> bytes:
    """Each ring of the grid proves its own secret, so no connection made for one
    ring is taken for another's."""
    return hashlib.blake2b(secret, key=b"row" if kind == 0 else b"column").digest()
