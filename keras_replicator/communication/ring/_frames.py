"""The socket ring's bytes on the wire: the per-call header and deadlines.

Why each piece exists (issue 22: the ring is the default gradient transport, so it
must be at least as safe as TensorFlow's collectives; who may connect at all is
`_handshake`):

* **Header.** Every call sends a 64-byte header (magic, call counter, bytes,
  elements, dtype name, operation) before its data, and checks the left
  neighbour's before receiving any data, so buffers that differ between workers
  (10 vs 12 values, float32[16] vs float64[8]: the same bytes) are an error naming
  both sides instead of a silent wrong sum; so are different operations (one
  worker's `reduce_scatter` against its neighbour's `all_reduce` of the same
  buffer would otherwise pair up byte for byte: issue 24).
* **Deadlines.** `send_all` / `receive_into` take one absolute `time.monotonic()`
  deadline and give each socket operation only the time left, so a peer that
  trickles bytes cannot keep a call alive past it. `exchange` is one ring step
  under that deadline: the header, then sending while receiving.

Hand-written because nothing in the standard library or our dependencies frames
a raw TCP stream; `struct` does the packing.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np


class FrameMismatch(RuntimeError):
    """A left neighbour's call header that differs from this worker's."""


# --------------------------------------------------------------------------- header
# magic, call, bytes, elements, dtype name, operation; padded to 64 bytes so the
# data after it keeps the arrays' cache-line alignment in the stream (the kernel
# copies faster). "KRc2": the operation field is new (issue 24).
_HEADER = struct.Struct("!4sQQQ16s16s4x")
_MAGIC = b"KRc2"
HEADER_SIZE = _HEADER.size
OPERATIONS = ("all_reduce", "reduce_scatter", "all_gather", "all_reduce_count")


def header(call: int, dtype, elements: int, operation: str = "all_reduce") -> bytes:
    """The header of call number `call`: `operation` on `elements` values of `dtype`.

    Example:
    >>> describe(header(3, "float32", 10, "reduce_scatter"))
    'call 3: float32[10] (40 bytes) in reduce_scatter'
    """
    if operation not in OPERATIONS:
        raise ValueError(
            f"`operation` must be one of {OPERATIONS}. Received: "
            f"operation={operation!r}."
        )
    dtype = np.dtype(dtype)
    name = dtype.name.encode()[:16]
    size = elements * dtype.itemsize
    return _HEADER.pack(_MAGIC, call, size, elements, name, operation.encode())


def describe(frame: bytes) -> str:
    """A header as `call 3: float32[10] (40 bytes) in all_reduce`; or what it is not."""
    magic, call, size, elements, name, operation = _HEADER.unpack(frame)
    if magic != _MAGIC:
        return f"bytes that are not a ring header ({frame[:16]!r}...)"
    name = name.rstrip(b"\0").decode(errors="replace")
    operation = operation.rstrip(b"\0").decode(errors="replace")
    return f"call {call}: {name}[{elements}] ({size} bytes) in {operation}"


def check_header(received: bytes, expected: bytes, rank: int, left: int) -> None:
    """Raises `FrameMismatch` naming both sides if the two headers differ."""
    if received == expected:
        return
    sides = (
        f"worker {left} sent {describe(received)}, worker {rank} has "
        f"{describe(expected)}"
    )
    theirs, mine = _HEADER.unpack(received), _HEADER.unpack(expected)
    if theirs[0] == mine[0] and theirs[-1] != mine[-1]:
        raise FrameMismatch(
            f"the operations differ between workers: {sides}. Every worker must "
            "make the same ring calls in the same order (e.g. weight-update "
            "sharding on all workers or on none)"
        )
    raise FrameMismatch(
        f"the buffers differ between workers: {sides}. Every worker must sum the "
        "same tensors in the same order (e.g. the same trainable variables, built "
        "the same way on every worker)"
    )


# ------------------------------------------------------------------ deadline-bound I/O
_MAX_IOV = 512  # below Linux's IOV_MAX (1024)


def _remaining(deadline) -> float | None:
    """Seconds left before `deadline` (None: no deadline); times out if none."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    return left


def _advance(buffers, count):
    """Drops the first `count` bytes of a list of memoryviews."""
    while buffers and count >= len(buffers[0]):
        count -= len(buffers[0])
        buffers = buffers[1:]
    if buffers and count:
        buffers = [buffers[0][count:], *buffers[1:]]
    return buffers


def send_all(sock, buffers, deadline) -> None:
    """Sends every byte of `buffers` (scatter-gather) before `deadline`."""
    buffers = [b for b in buffers if len(b)]
    while buffers:
        sock.settimeout(_remaining(deadline))
        buffers = _advance(buffers, sock.sendmsg(buffers[:_MAX_IOV]))


def receive_into(sock, buffers, deadline) -> None:
    """Fills every byte of the writable `buffers` before `deadline`."""
    buffers = [b for b in buffers if len(b)]
    while buffers:
        sock.settimeout(_remaining(deadline))
        count = sock.recvmsg_into(buffers[:_MAX_IOV])[0]
        if count == 0:
            raise ConnectionError("the connection was closed")
        buffers = _advance(buffers, count)


def receive_exact(sock, size: int, deadline) -> bytes:
    """The next `size` bytes from `sock`, before `deadline`."""
    data = bytearray(size)
    receive_into(sock, [memoryview(data)], deadline)
    return bytes(data)


def shut_down(*sockets) -> None:
    """Ends the connections: blocked calls return, the peers see EOF."""
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by the peer


def exchange(
    sockets, rank: int, size: int, outgoing, incoming, deadline, header=None
) -> int:
    """One ring step: sends `outgoing` to the right while receiving `incoming`.

    With a `header`, it goes out first (before any check here, so a peer always
    gets it and can name both sides), and the left neighbour's is received and
    checked before any of its data. A failed receive shuts both connections down
    (waking the sender thread); a closed connection names the worker behind it.

    `sockets` are `(send, receive)`, to worker `rank + 1` and from `rank - 1`
    of `size`; `header` is the call's, on its first step only. Returns the
    payload bytes sent (the header excluded).
    """
    sock, source = sockets
    errors = []
    send = [memoryview(a.view(np.uint8)) for a in outgoing]
    receive = [memoryview(a.view(np.uint8)) for a in incoming]
    left, right = (rank - 1) % size, (rank + 1) % size
    if header is not None:
        try:
            send_all(sock, [header], deadline)
        except ConnectionError as error:
            raise ConnectionError(f"worker {right} closed its connection") from error

    def sender():
        try:
            send_all(sock, send, deadline)
        except OSError as error:  # reported below, in the calling thread
            errors.append(error)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    try:
        if header is not None:
            theirs = receive_exact(source, len(header), deadline)
            check_header(theirs, header, rank, left)
        receive_into(source, receive, deadline)
    except BaseException as error:
        shut_down(*sockets)  # wakes the sender up
        thread.join()
        if isinstance(error, ConnectionError):
            raise ConnectionError(f"worker {left} closed its connection") from error
        raise
    thread.join(None if deadline is None else max(deadline - time.monotonic(), 0))
    if thread.is_alive():
        shut_down(*sockets)
        thread.join()
        raise TimeoutError("the deadline passed")
    if errors:
        if isinstance(errors[0], ConnectionError):
            closed = f"worker {right} closed its connection"
            raise ConnectionError(closed) from errors[0]
        raise errors[0]
    return sum(len(b) for b in send)


def aligned_empty(size: int, dtype) -> np.ndarray:
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
