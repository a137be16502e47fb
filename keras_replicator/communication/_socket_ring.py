"""A ring all-reduce over plain TCP sockets, for CPU workers where gRPC is the limit.

Why: between two TensorFlow worker processes on one 2-core machine, TensorFlow's
collective all-reduce of 102 MB of gradients moves 7-15% of what the same
processes push through a loopback socket in the same run (benchmarks/allreduce.py):
every chunk of its ring is serialized into a gRPC message, copied several times,
and the copying competes with the workers for the same cores. Packing only
halves that. This module sums a flat buffer with the textbook ring
(reduce-scatter, then all-gather; Patarasuk & Yuan 2009) over one persistent TCP
connection to each ring neighbour, so each byte is copied by the kernel and added
once by numpy.

It is used as ``tf.numpy_function`` per gradient bucket, by a
`MultiWorkerReplicator` whose workers have one CPU replica each: by default when
every worker can open it (`transport=None`), always with `transport="socket"`.
Calls are serialized in graph order (each bucket's op has a control dependency on
the previous one), so every worker sends the same buckets in the same order. A dead
peer fails the call at once (its connection closes), a hung one after the
strategy's collective timeout, like TensorFlow's collectives.
"""

from __future__ import annotations

import socket
import threading
import warnings

import numpy as np
import tensorflow as tf


class SocketRing:
    """This worker's two connections in the ring: to rank+1 and from rank-1."""

    def __init__(self, rank: int, size: int, send, receive):
        self.rank = rank
        self.size = size
        self._send = send
        self._receive = receive
        self._lock = threading.Lock()

    @classmethod
    def connect(
        cls, strategy, timeout: float, required: bool = True
    ) -> SocketRing | None:
        """Opens the ring among the strategy's workers (call on every worker).

        The listening ports and IPv4 addresses are exchanged with one all-reduce
        of the strategy, so no port needs to be configured. Whether each worker
        could listen rides with its address, and whether it could connect takes
        one more all-reduce, so every worker takes the same decision.

        Args:
            strategy: The `MultiWorkerReplicator` being built.
            timeout: Seconds a ring call may wait for a peer.
            required: Raise if the ring cannot be opened on every worker.
                Otherwise return `None` (the caller falls back to the
                collectives); connecting then waits at most `AUTO_CONNECT_TIMEOUT`.

        Returns:
            This worker's `SocketRing`, or `None` if `required` is False and some
            worker could not open it.

        Raises:
            RuntimeError: If `required` and some worker could not open the ring,
                naming the worker and the reason.
        """
        size = strategy.num_replicas_in_sync
        server, row, problem = _listen(strategy)
        table, rank = _share(strategy, row + [_flag(problem)])
        failed = _failed(table)
        if failed:
            if server is not None:
                server.close()
            return _give_up(required, failed, problem)
        wait = timeout if required else min(timeout, AUTO_CONNECT_TIMEOUT)
        right = table[(rank + 1) % size]
        send = receive = None
        try:
            right_host = ".".join(str(int(v)) for v in right[:4])
            send = socket.create_connection((right_host, int(right[4])), timeout=wait)
            server.settimeout(wait + 5.0)  # the left neighbour may start a bit later
            receive, _ = server.accept()
        except OSError as error:
            problem = f"{type(error).__name__}: {error}"
        server.close()
        table, _ = _share(strategy, [_flag(problem)])
        failed = _failed(table)
        if failed:
            for s in (send, receive):
                if s is not None:
                    s.close()
            return _give_up(required, failed, problem)
        for s in (send, receive):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(timeout)
        return cls(rank, size, send, receive)

    def all_reduce(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Returns the sums over all workers of `arrays` (one dtype, any shapes).

        The arrays are treated as one virtual flat buffer split into one chunk per
        worker; bytes go straight from and into the arrays (scatter-gather socket
        calls), so no flat copy is made. 16-bit inputs travel in 16 bits but are
        added in float32 (numpy has no vectorised float16 / bfloat16 arithmetic).
        """
        with self._lock:
            flats = [a.reshape(-1) for a in arrays]
            results = [_aligned_empty(f.size, f.dtype) for f in flats]
            total = sum(f.size for f in flats)
            if self.size == 1 or total == 0:
                for r, f in zip(results, flats):
                    r[...] = f
                return [r.reshape(a.shape) for r, a in zip(results, arrays)]
            n, rank = self.size, self.rank
            bounds = [k * total // n for k in range(n + 1)]
            offsets = np.cumsum([0] + [f.size for f in flats])

            def pieces(buffers, chunk):
                lo, hi = bounds[chunk], bounds[chunk + 1]
                out = []
                for f, start in zip(buffers, offsets[:-1]):
                    a, b = max(lo, start), min(hi, start + f.size)
                    if a < b:
                        out.append(f[a - start : b - start])
                return out

            widen = flats[0].dtype.itemsize < 4
            for step in range(n - 1):  # reduce-scatter
                sent = (rank - step) % n
                target = (rank - step - 1) % n
                source = flats if step == 0 else results
                # The partial sum arrives straight in the result's chunk (not yet
                # used: each chunk is visited once), and this worker's part is
                # added in place: no scratch buffer to allocate and fault in.
                into = pieces(results, target)
                self._exchange(pieces(source, sent), into)
                for mine, part in zip(pieces(flats, target), into):
                    if widen:
                        part[...] = (
                            part.astype(np.float32) + mine.astype(np.float32)
                        ).astype(part.dtype)
                    else:
                        np.add(part, mine, out=part)
            for step in range(n - 1):  # all-gather
                sent, target = (rank - step + 1) % n, (rank - step) % n
                self._exchange(pieces(results, sent), pieces(results, target))
            return [r.reshape(a.shape) for r, a in zip(results, arrays)]

    def _exchange(self, outgoing, incoming) -> None:
        """Sends the `outgoing` arrays while receiving into the `incoming` ones."""
        errors = []
        send = [memoryview(a.view(np.uint8)) for a in outgoing]
        receive = [memoryview(a.view(np.uint8)) for a in incoming]

        def sender():
            try:
                _send_all(self._send, send)
            except OSError as error:  # reported below, in the calling thread
                errors.append(error)

        thread = threading.Thread(target=sender, daemon=True)
        thread.start()
        try:
            _receive_all(self._receive, receive)
        except (OSError, ConnectionError) as error:
            raise RuntimeError(
                f"Socket all-reduce failed on worker {self.rank}: {error}. A peer "
                "died or hung; it fails after the strategy's collective timeout."
            ) from error
        thread.join()
        if errors:
            raise RuntimeError(
                f"Socket all-reduce failed on worker {self.rank}: {errors[0]}."
            )


AUTO_CONNECT_TIMEOUT = 10.0


def _listen(strategy):
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
            server.listen(1)
        except OSError:
            server.close()
            raise
    except OSError as error:
        return None, [0.0] * 5, f"cannot listen on {address!r}: {error}"
    port = server.getsockname()[1]
    return server, [float(int(part)) for part in host.split(".")] + [float(port)], None


def _share(strategy, row):
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


def _flag(problem) -> float:
    """1.0 if this worker had a problem: the last column of a shared row."""
    return 0.0 if problem is None else 1.0


def _failed(table) -> list[int]:
    """The workers whose shared row ends with a problem flag."""
    return [rank for rank, row in enumerate(table) if row[-1] != 0.0]


def _give_up(required: bool, failed, problem) -> None:
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


def _aligned_empty(size: int, dtype) -> np.ndarray:
    """A new 1-D array whose data starts on a 64-byte boundary.

    TensorFlow adopts a returned numpy array without copying only if it is aligned
    as its own allocator aligns (64 bytes); numpy's large arrays start 16 bytes
    into a page, and the copy (plus its page faults) cost 65 ms per 100 MB here.
    """
    dtype = np.dtype(dtype)
    raw = np.empty(size * dtype.itemsize + _ALIGNMENT, np.uint8)
    offset = -raw.ctypes.data % _ALIGNMENT
    return raw[offset : offset + size * dtype.itemsize].view(dtype)


_ALIGNMENT = 64


def _advance(buffers, count):
    """Drops the first `count` bytes of a list of memoryviews."""
    while buffers and count >= len(buffers[0]):
        count -= len(buffers[0])
        buffers = buffers[1:]
    if buffers and count:
        buffers = [buffers[0][count:], *buffers[1:]]
    return buffers


def _send_all(sock, buffers) -> None:
    buffers = [b for b in buffers if len(b)]
    while buffers:
        buffers = _advance(buffers, sock.sendmsg(buffers[:_MAX_IOV]))


def _receive_all(sock, buffers) -> None:
    buffers = [b for b in buffers if len(b)]
    while buffers:
        count = sock.recvmsg_into(buffers[:_MAX_IOV])[0]
        if count == 0:
            raise ConnectionError("a ring peer closed its connection")
        buffers = _advance(buffers, count)


_MAX_IOV = 512  # below Linux's IOV_MAX (1024)
