"""A ring all-reduce over plain TCP sockets, for CPU workers where gRPC is the limit.

Why: between two worker processes on one 2-core machine, TensorFlow's collective
all-reduce of 102 MB moves 7-15% of what the same processes push through a
loopback socket (benchmarks/allreduce.py): every chunk is serialized into a gRPC
message and copied several times, on the workers' cores. This module sums a flat
buffer with the textbook ring (reduce-scatter, then all-gather; Patarasuk & Yuan
2009) over one persistent TCP connection to each ring neighbour, so each byte is
copied by the kernel and added once by numpy (on one machine: through shared
memory, the sockets carry notes; `_shared_memory`, issue 23: 25 MB in 7 ms, not 14).

The two phases are also calls of their own (issue 24), for weight-update sharding:
`reduce_scatter` leaves worker r with chunk r of the sum, the optimizer updates
that chunk only, and `all_gather` rebuilds the weights, for `all_reduce`'s bytes
(`bytes_sent`) and bits (it runs the same phases, adding in the same order).

It is a ``tf.numpy_function`` per gradient bucket of a `MultiWorkerReplicator` of
one-CPU-replica workers (the default transport there, or `transport="socket"`).
Calls are serialized in graph order (each bucket's op has a control dependency on
the previous one), so every worker sends the same buckets in the same order. A dead
peer fails the call at once (its connection closes), a hung one after the
strategy's collective timeout, like TensorFlow's collectives.

Safety (`_handshake`, `_frames`, issue 22): every connection proves a per-job
secret agreed through the strategy's own all-reduce, so a stranger that connects
to a ring port is refused (and cannot hold it: connections are served all at
once, issue 34); every call sends a header that the receiver checks before any
data, so buffers that differ between workers are an error on both sides of the link; the
whole call has one deadline, the collective timeout; and a ring that failed once
stays failed (its connections are shut down, so its neighbours fail at once too,
and every later call raises naming the first failure): after a failure the
workers' calls no longer pair up, and a later call would mix sums across calls.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from keras_replicator.communication import _division
from keras_replicator.communication.ring import (
    _arrays,
    _frames,
    _hierarchical,
    _opening,
    _passes,
    _shared_memory,
)


class SocketRing:
    """This worker's two connections in the ring: to rank+1 and from rank-1.

    Args:
        rank: This worker's place in the ring.
        size: The number of workers.
        send: The connected socket to worker `rank + 1`.
        receive: The connected socket from worker `rank - 1`.
        timeout: Seconds one call may take. Defaults to `None`: the `send`
            socket's timeout (`None` there: no deadline).
        link: The `_shared_memory.Link` whose segments carry the payloads
            between workers on one machine. Defaults to `None`: the sockets do.
        order: The worker (replica) at each ring position (`_setup.ring_order`:
            grouped by machine). Defaults to `None`: worker `p` at position `p`.
            `rank` is this worker's position; `all_reduce` does not depend on
            the order (every worker gets the sums), `reduce_scatter` and
            `all_gather` number their chunks by worker, not by position.

    Attributes:
        replica: This worker's index (`order[rank]`): the chunk
            `reduce_scatter` leaves it.
        bytes_sent: The payload bytes this worker has sent, headers excluded.
        calls: The calls this worker has made (`all_reduce`, `reduce_scatter`,
            `all_gather`; none with one worker): each is one ring protocol.
        overlaps: Whether every worker runs its ops on more than one inter-op
            thread, so that a ring call can run during the backward pass
            (agreed in `connect`; True for a ring made otherwise).
    """

    def __init__(
        self, rank: int, size: int, send, receive, timeout=None, link=None, order=None
    ):
        self.rank, self.size = rank, size
        self.order = list(range(size)) if order is None else list(order)
        if sorted(self.order) != list(range(size)):
            raise ValueError(
                f"`order` must list each of the {size} workers once. Received: "
                f"order={order!r}."
            )
        self._link = link or _shared_memory.Link(None, None)
        self._send, self._receive = send, receive
        self._timeout = send.gettimeout() if timeout is None else timeout
        self.replica = self.order[rank]
        self._lock = threading.Lock()
        self.calls = 0
        self.overlaps = True  # the default buckets follow it (`_all_reduce`)
        self._failure = None  # the first failure's description; the ring is dead
        self.bytes_sent = 0

    @classmethod
    def connect(
        cls,
        strategy,
        timeout: float,
        required: bool = True,
        bucket_bytes: int = 0,
        grid: bool | None = None,
    ) -> SocketRing | _hierarchical.HierarchicalRing | None:
        """Opens the ring among the strategy's workers (call on every worker).

        On several machines with the same number (>= 2) of workers each, the
        ring also opens its rows and columns and returns a
        `_hierarchical.HierarchicalRing` (unless some worker sets
        `KERAS_REPLICATOR_RING_HIERARCHY=0`).

        The listening ports and IPv4 addresses are exchanged with one all-reduce
        of the strategy, so no port needs to be configured; each worker's random
        words ride in the same table, and every worker hashes them into the job's
        secret, which each connection must prove (`_frames`). Whether each
        worker could listen rides with its address, and whether it could connect
        takes one more all-reduce, so every worker takes the same decision.

        Args:
            strategy: The `MultiWorkerReplicator` being built.
            timeout: Seconds a ring call may take.
            required: Raise if the ring cannot be opened on every worker.
                Otherwise return `None` (the caller falls back to the
                collectives); connecting then waits at most
                `_setup.AUTO_CONNECT_TIMEOUT`.
            bucket_bytes: The largest buffer expected, to size shared memory.
            grid: Whether to open rows and columns where the machines form a
                grid. Defaults to `None`: `_hierarchical.enabled()` (yes unless
                `KERAS_REPLICATOR_RING_HIERARCHY=0`); an `AllReduceOptions`
                `hierarchy` passes True.

        Returns:
            This worker's `SocketRing` (or `HierarchicalRing`), or `None` if
            `required` is False and some worker could not open it.

        Raises:
            RuntimeError: If `required` and some worker could not open the ring,
                naming the worker and the reason.
        """
        return _opening.connect(cls, strategy, timeout, required, bucket_bytes, grid)

    def all_reduce(
        self, *arrays: np.ndarray, divide_by=None, counts=None, out=None
    ) -> list[np.ndarray]:
        """Returns the sums over all workers of `arrays` (one dtype, any shapes).

        `divide_by`: divide the sums by it (float32 / float64; `_division`).

        `counts`: float32 values (the sample counts) summed exactly alongside,
        in the same call (issue 36: not a call of their own before it): each
        chunk's message carries a copy, so after the reduce phase every worker
        holds their sum beside its summed chunk and divides the chunk by the
        summed `counts[0]` as `divide_by` would. Their sum is returned last
        (a 1-D float32 array). Needs float32 / float64 `arrays`.

        The arrays are treated as one virtual flat buffer split into one chunk per
        worker; bytes go straight from and into the arrays (scatter-gather socket
        calls), so no flat copy is made. 16-bit inputs travel in 16 bits but are
        added in float32 (numpy has no vectorised float16 / bfloat16 arithmetic).

        `out`: arrays to write the sums into, one per input (its size, its
        dtype; not the input itself), for reused buffers. Defaults to new ones.

        Raises:
            ValueError: `divide_by` and `counts` both given.
            RuntimeError: If the call fails (a peer died, hung past the collective
                timeout, sent a different buffer) or an earlier one did.
        """
        if divide_by is not None and counts is not None:
            raise ValueError(
                "`divide_by` and `counts` both say what to divide by; pass one. "
                f"Received: divide_by={divide_by!r}, counts={counts!r}."
            )
        flats = [a.reshape(-1) for a in arrays]
        outs = [None] * len(flats) if out is None else list(out)
        if len(outs) != len(flats):
            raise ValueError(
                f"`out` must hold one array per input ({len(flats)}). Received: "
                f"{len(outs)} arrays."
            )
        results = [
            _arrays.output(o, f.size, f.dtype, flats) for o, f in zip(outs, flats)
        ]
        dtype = flats[0].dtype if flats else np.dtype("float32")
        total, n = sum(f.size for f in flats), self.size
        if n == 1:
            for r, f in zip(results, flats):
                r[...] = f
        bounds = [k * total // n for k in range(n + 1)]
        offsets = np.cumsum([0] + [f.size for f in flats])
        # (every chunk's copy of the counts, their sums) or None
        slots = _arrays.count_slots(counts, n)

        def pieces(buffers, chunk, slot=None):
            lo, hi = bounds[chunk], bounds[chunk + 1]
            out = []
            for f, start in zip(buffers, offsets[:-1]):
                a, b = max(lo, start), min(hi, start + f.size)
                if a < b:
                    out.append(f[a - start : b - start])
            if slot is not None:  # after the chunk: the arrays' alignment holds
                out.append(slot[chunk])
            return out

        own, summed = slots if slots is not None else (None, None)

        def work(header, deadline):
            # Partial sums arrive straight in the results' chunks (not yet used:
            # each chunk is visited once): no scratch buffer to allocate and
            # fault in. An empty buffer still sends its header: peers may differ.
            into = lambda step, chunk: pieces(results, chunk, summed)  # noqa: E731
            mine = lambda chunk: pieces(flats, chunk, own)  # noqa: E731
            finish = None
            if divide_by is not None or summed is not None:
                # The count is summed by the time the final step's sums are read.
                divisor = lambda: divide_by if summed is None else summed[self.rank]  # noqa: E731
                finish = _passes.Finish(divisor, counts=0 if summed is None else 1)
            self._reduce(mine, into, header, deadline, finish, then_gather=True)
            if finish is not None and not finish.applied:
                _division.divide_in_place(pieces(results, self.rank), finish.divisor())
            self._gather(lambda c: pieces(results, c, summed), None, deadline)

        operation = "all_reduce" if slots is None else "all_reduce_count"
        self._call(operation, dtype, total, work)
        if n == 1 and summed is not None:
            summed[0][...] = own[0]
        if n == 1 and (divide_by is not None or summed is not None):
            divisor = divide_by if summed is None else summed[0]
            _division.divide_in_place(results, divisor)
        outputs = [r.reshape(a.shape) for r, a in zip(results, arrays)]
        return outputs if summed is None else [*outputs, summed[0].copy()]

    def reduce_scatter(self, flat: np.ndarray, out=None) -> np.ndarray:
        """Returns chunk `replica` (this worker's index) of the sum of `flat`.

        The first phase of `all_reduce` alone: with `L = flat.size // size`,
        chunk `c` is `flat[c * L : (c + 1) * L]`; each worker sends `(size - 1)
        * L` values. Weight-update sharding updates this chunk, then gathers.

        Args:
            flat: This worker's 1-D buffer, its size a multiple of `size` (the
                same shape and dtype on every worker).

            out: A 1-D array of `flat.size // size` values and `flat`'s dtype to
                write the chunk into (reused buffers). Defaults to a new one.

        Returns:
            `out`, or a new 64-byte aligned 1-D array of `flat.size // size` values.

        Raises:
            ValueError: `flat` not 1-D, or not a multiple of `size` values.

        Example (two workers as threads; an optimizer would update the chunk):
        >>> import socket, concurrent.futures
        >>> (a, b), (c, d) = socket.socketpair(), socket.socketpair()
        >>> rings = [SocketRing(0, 2, a, d), SocketRing(1, 2, c, b)]
        >>> grads = [np.arange(4.0), np.full(4, 10.0)]
        >>> step = lambda r: rings[r].all_gather(rings[r].reduce_scatter(grads[r]))
        >>> out = list(concurrent.futures.ThreadPoolExecutor(2).map(step, [0, 1]))
        >>> out[1], rings[1].bytes_sent  # 2 float64 values in each phase
        (array([10., 11., 12., 13.]), 32)
        """
        flat, n = _arrays.vector(flat, "flat", self.size), self.size
        length = flat.size // n
        result = _arrays.output(out, length, flat.dtype, [flat])
        if n == 1:
            result[...] = flat
        # Partial sums alternate in 2 buffers (one sent, one filling): last `result`.
        spare = [result, _frames.aligned_empty(length if n > 2 else 0, flat.dtype)]
        rows = self.order  # the chunk at position c is worker order[c]'s
        mine = lambda c: [flat[rows[c] * length : (rows[c] + 1) * length]]  # noqa: E731
        into = lambda step, c: [spare[(n - 2 - step) % 2]]  # noqa: E731
        self._call("reduce_scatter", flat.dtype, flat.size, self._reduce, mine, into)
        return result

    def all_gather(self, chunk: np.ndarray, out=None) -> np.ndarray:
        """Returns every worker's 1-D `chunk` (same size and dtype) in rank order.

        The second phase of `all_reduce` alone (example: `reduce_scatter`): a new
        64-byte aligned 1-D array, worker r's chunk at `[r * L : (r + 1) * L]`
        (`L = chunk.size`); each worker sends `(size - 1) * L` values. Raises
        `ValueError` if `chunk` is not 1-D, `RuntimeError` as `all_reduce`.
        `out`: as `reduce_scatter`'s (`size * L` values)."""
        chunk = _arrays.vector(chunk, "chunk")
        length = chunk.size
        result = _arrays.output(out, self.size * length, chunk.dtype, [chunk])
        rows = self.order  # worker order[c]'s chunk, in worker order
        result[self.replica * length : (self.replica + 1) * length] = chunk
        pieces = lambda c: [result[rows[c] * length : (rows[c] + 1) * length]]  # noqa: E731
        self._call("all_gather", chunk.dtype, length, self._gather, pieces)
        return result

    def _call(self, operation, dtype, elements, work, *args) -> None:
        """Runs `work(*args, header, deadline)` as a call (none for one worker)."""
        with self._lock:
            if self._failure is not None:
                raise RuntimeError(
                    f"The socket ring failed earlier on worker {self.replica}, so it "
                    f"is closed and every later call fails: {self._failure} The "
                    "workers' calls no longer pair up; restart the job (e.g. "
                    "resuming with `keras.callbacks.BackupAndRestore`)."
                )
            if self.size == 1:
                return
            self.calls += 1
            header = _frames.header(self.calls, dtype, elements, operation)
            deadline = None
            if self._timeout is not None:
                deadline = time.monotonic() + self._timeout
            try:
                work(*args, header, deadline)
            except BaseException as error:
                failure = self._fail(error, operation)
                if failure is error:
                    raise
                raise failure from error

    def _reduce(
        self, mine, into, header, deadline, finish=None, then_gather=False
    ) -> None:
        """The reduce-scatter phase: worker r ends with chunk r summed, from r + 1 on.

        `mine(c)`: this worker's chunk `c` (a list of arrays); `into(step, c)`:
        where its partial sum arrives at `step`, in the same pieces. `finish`:
        the final step's `_passes.Finish`. `then_gather`: the final sum
        is what the all-gather sends first. Each partial sum received is what
        this worker sends next, so it is staged as it is read (`_shared_memory`).
        """
        n, rank = self.size, self.rank
        outgoing = mine((rank - 1) % n)
        for step in range(n - 1):
            target = (rank - step - 2) % n
            incoming = into(step, target)
            first = header if step == 0 else None
            last = step == n - 2
            self._exchange(
                outgoing,
                incoming,
                deadline,
                first,
                mine(target),
                finish=finish if last else None,
                stage=then_gather or not last,
            )
            outgoing = incoming

    def _gather(self, chunk, header, deadline) -> None:
        """The all-gather phase: `chunk(c)`, held by worker `c`, reaches all.

        Each chunk received but the last is forwarded at the next step: staged."""
        n, rank = self.size, self.rank
        for step in range(n - 1):
            sent, target = (rank - step) % n, (rank - step - 1) % n
            first = header if step == 0 else None
            stage = step < n - 2
            self._exchange(chunk(sent), chunk(target), deadline, first, stage=stage)

    def _exchange(self, outgoing, incoming, deadline, header=None, plus=None, **fusing):
        """One step (`_shared_memory.Link.exchange`, which takes `finish` and
        `stage` in `fusing`); counted in `bytes_sent`."""
        sockets, args = (self._send, self._receive), (outgoing, incoming, deadline)
        self.bytes_sent += self._link.exchange(
            sockets, self.rank, self.size, *args, header, plus, **fusing
        )

    def _fail(self, error, operation="all_reduce") -> BaseException:
        """Marks the ring failed, closes it; returns the error to raise."""
        if isinstance(error, _frames.FrameMismatch):
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
        where = ""
        if self.order != list(range(self.size)):  # the links name ring positions
            where = f" (ring position {self.rank}; workers by position: {self.order})"
        if self._failure is None:  # the first cause, not the closed sockets' after
            self._failure = f"call {self.calls} failed{where}: {cause}."
        _frames.shut_down(self._send, self._receive)
        for s in (self._send, self._receive):
            s.close()
        self._link.close()
        if not isinstance(error, Exception):
            return error  # KeyboardInterrupt and friends stay what they are
        name = operation.replace("_", "-")
        return RuntimeError(
            f"Socket {name} failed on worker {self.replica}: {self._failure}"
        )
