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

Safety (`_ring_frames`, issue 22): every connection proves a per-job secret agreed
through the strategy's own all-reduce, so a stranger that connects to a ring port
is refused; every call sends a header that the receiver checks before any data,
so buffers that differ between workers are an error on both sides of the link; the
whole call has one deadline, the collective timeout; and a ring that failed once
stays failed (its connections are shut down, so its neighbours fail at once too,
and every later call raises naming the first failure): after a failure the
workers' calls no longer pair up, and a later call would mix sums across calls.
"""

from __future__ import annotations

import socket
import threading
import time
import warnings

import numpy as np
import tensorflow as tf

from keras_replicator.communication import _ring_frames


class SocketRing:
    """This worker's two connections in the ring: to rank+1 and from rank-1.

    Args:
        rank: This worker's place in the ring.
        size: The number of workers.
        send: The connected socket to worker `rank + 1`.
        receive: The connected socket from worker `rank - 1`.
        timeout: Seconds one `all_reduce` call may take. Defaults to `None`:
            the `send` socket's timeout (`None` there: no deadline).
    """

    def __init__(self, rank: int, size: int, send, receive, timeout=None):
        self.rank = rank
        self.size = size
        self._send = send
        self._receive = receive
        self._timeout = send.gettimeout() if timeout is None else timeout
        self._lock = threading.Lock()
        self._calls = 0
        self._failure = None  # the first failure's description; the ring is dead

    @classmethod
    def connect(
        cls, strategy, timeout: float, required: bool = True
    ) -> SocketRing | None:
        """Opens the ring among the strategy's workers (call on every worker).

        The listening ports and IPv4 addresses are exchanged with one all-reduce
        of the strategy, so no port needs to be configured; each worker's random
        words ride in the same table, and every worker hashes them into the job's
        secret, which each connection must prove (`_ring_frames`). Whether each
        worker could listen rides with its address, and whether it could connect
        takes one more all-reduce, so every worker takes the same decision.

        Args:
            strategy: The `MultiWorkerReplicator` being built.
            timeout: Seconds a ring call may take.
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
        words = _ring_frames.secret_words()
        table, rank = _share(strategy, row + words + [_flag(problem)])
        failed = _failed(table)
        if failed:
            if server is not None:
                server.close()
            return _give_up(required, failed, problem)
        secret = _ring_frames.derive_secret(table[:, len(row) : len(row) + len(words)])
        wait = timeout if required else min(timeout, AUTO_CONNECT_TIMEOUT)
        send = receive = None
        try:
            send, receive = _ring_frames.open_ring(
                server, table[(rank + 1) % size], secret, rank, size, wait
            )
        except (OSError, _ring_frames.HandshakeError) as error:
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
        return cls(rank, size, send, receive, timeout)

    def all_reduce(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Returns the sums over all workers of `arrays` (one dtype, any shapes).

        The arrays are treated as one virtual flat buffer split into one chunk per
        worker; bytes go straight from and into the arrays (scatter-gather socket
        calls), so no flat copy is made. 16-bit inputs travel in 16 bits but are
        added in float32 (numpy has no vectorised float16 / bfloat16 arithmetic).

        Raises:
            RuntimeError: If the call fails (a peer died, hung past the collective
                timeout, or sent a buffer that differs from this one), or if an
                earlier call failed: the ring then stays failed.
        """
        with self._lock:
            if self._failure is not None:
                raise RuntimeError(
                    f"The socket ring failed earlier on worker {self.rank}, so it "
                    f"is closed and every later call fails: {self._failure} The "
                    "workers' calls no longer pair up; restart the job (e.g. "
                    "resuming with `keras.callbacks.BackupAndRestore`)."
                )
            flats = [a.reshape(-1) for a in arrays]
            results = [_aligned_empty(f.size, f.dtype) for f in flats]
            if self.size == 1:
                for r, f in zip(results, flats):
                    r[...] = f
            else:
                self._calls += 1
                deadline = None
                if self._timeout is not None:
                    deadline = time.monotonic() + self._timeout
                try:
                    self._sum(flats, results, deadline)
                except BaseException as error:
                    failure = self._fail(error)
                    if failure is error:
                        raise
                    raise failure from error
            return [r.reshape(a.shape) for r, a in zip(results, arrays)]

    def _sum(self, flats, results, deadline) -> None:
        """The ring algorithm proper; the call header rides with the first send."""
        total = sum(f.size for f in flats)
        dtype = flats[0].dtype if flats else np.dtype("float32")
        header = _ring_frames.header(self._calls, dtype, total)
        n, rank = self.size, self.rank
        if total == 0:  # still compared with the peers': they may hold data
            self._exchange([], [], deadline, header)
            return
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

        widen = dtype.itemsize < 4
        for step in range(n - 1):  # reduce-scatter
            sent = (rank - step) % n
            target = (rank - step - 1) % n
            source = flats if step == 0 else results
            # The partial sum arrives straight in the result's chunk (not yet
            # used: each chunk is visited once), and this worker's part is
            # added in place: no scratch buffer to allocate and fault in.
            into = pieces(results, target)
            first = header if step == 0 else None
            self._exchange(pieces(source, sent), into, deadline, first)
            for mine, part in zip(pieces(flats, target), into):
                if widen:
                    part[...] = (
                        part.astype(np.float32) + mine.astype(np.float32)
                    ).astype(part.dtype)
                else:
                    np.add(part, mine, out=part)
        for step in range(n - 1):  # all-gather
            sent, target = (rank - step + 1) % n, (rank - step) % n
            self._exchange(pieces(results, sent), pieces(results, target), deadline)

    def _exchange(self, outgoing, incoming, deadline, header=None) -> None:
        """Sends the `outgoing` arrays while receiving into the `incoming` ones.

        With a `header`, it goes out first (before any check here, so a peer
        always gets it and can name both sides), and the left neighbour's is
        received and checked before any of its data.
        """
        errors = []
        send = [memoryview(a.view(np.uint8)) for a in outgoing]
        receive = [memoryview(a.view(np.uint8)) for a in incoming]
        left, right = (self.rank - 1) % self.size, (self.rank + 1) % self.size
        if header is not None:
            try:
                _ring_frames.send_all(self._send, [header], deadline)
            except ConnectionError as error:
                raise ConnectionError(
                    f"worker {right} closed its connection"
                ) from error

        def sender():
            try:
                _ring_frames.send_all(self._send, send, deadline)
            except OSError as error:  # reported below, in the calling thread
                errors.append(error)

        thread = threading.Thread(target=sender, daemon=True)
        thread.start()
        try:
            if header is not None:
                theirs = _ring_frames.receive_exact(
                    self._receive, len(header), deadline
                )
                _ring_frames.check_header(theirs, header, self.rank, left)
            _ring_frames.receive_into(self._receive, receive, deadline)
        except BaseException as error:
            self._shut_down()  # wakes the sender up
            thread.join()
            if isinstance(error, ConnectionError):
                raise ConnectionError(f"worker {left} closed its connection") from error
            raise
        thread.join(None if deadline is None else max(deadline - time.monotonic(), 0))
        if thread.is_alive():
            self._shut_down()
            thread.join()
            raise TimeoutError("the deadline passed")
        if errors:
            if isinstance(errors[0], ConnectionError):
                closed = f"worker {right} closed its connection"
                raise ConnectionError(closed) from errors[0]
            raise errors[0]

    def _shut_down(self) -> None:
        """Ends both connections: blocked calls return, the neighbours see EOF."""
        for s in (self._send, self._receive):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the peer

    def _fail(self, error) -> BaseException:
        """Marks the ring failed, closes it; returns the error to raise."""
        if isinstance(error, _ring_frames.FrameMismatch):
            cause = str(error)
        elif isinstance(error, TimeoutError):
            cause = (
                f"it did not finish within the collective timeout ({self._timeout} "
                "s): a peer hung or is too slow"
            )
        elif isinstance(error, ConnectionError):
            cause = f"{error}: it died, or its call failed (its own error names why)"
        else:
            cause = f"{type(error).__name__}: {error}"
        self._failure = f"call {self._calls} failed: {cause}."
        self._shut_down()
        for s in (self._send, self._receive):
            s.close()
        if not isinstance(error, Exception):
            return error  # KeyboardInterrupt and friends stay what they are
        return RuntimeError(
            f"Socket all-reduce failed on worker {self.rank}: {self._failure}"
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
            server.listen(8)  # strangers may queue ahead of the neighbour
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
