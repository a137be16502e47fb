"""The socket ring's payloads through shared memory, between workers on one machine.

Why (issue 23): on one host, loopback TCP makes the kernel copy every byte twice and
run the TCP stack over it, on the cores that compute the step: a 25 MB all-reduce
between 2 processes took 12 ms where copying the bytes costs 1.4 ms and adding them
1.3 ms (docs/performance.md). As NCCL's SHM transport does within a node, each worker
writes what it sends into a segment its right neighbour has mapped, and the
neighbour reads (and adds) straight out of it: one copy and one pass per byte.

The sockets stay: each step is a small *note* on them (step, bytes, the segment's
name when it grows), answered by an *ack* once read, so all `_ring_frames`
guarantees hold: proven connections, the call's header checked before any data,
one deadline per call, a dead or hung neighbour an error. A segment has two slots:
a worker writes step k + 1 while its neighbour reads step k, and waits for the ack
of step k - 1 before it writes over that slot again.

Which links use it is found out, not configured: when the ring opens, each worker
creates its segment in `/dev/shm` (mode 0600) with a random token in it and offers
name and token to its right neighbour over their proven connection; the neighbour
maps it, checks the token and unlinks it (nothing outlives a crash after that) and
says whether it could. Neighbours on other machines keep socket payloads on that
link. Space is reserved with `posix_fallocate` before any byte is written (a full
`/dev/shm`, e.g. Docker's 64 MB, would otherwise kill the process with SIGBUS); a
segment that cannot grow sends steps that large through the socket.
`KERAS_REPLICATOR_RING_SHARED_MEMORY=0` turns it off (as `NCCL_SHM_DISABLE`).

Hand-written: `multiprocessing.shared_memory` registers every segment a process
attaches with its resource tracker before Python 3.13 (which unlinks it when that
process exits) and cannot reserve space; `mmap` and `os` are all it needs.
"""

from __future__ import annotations

import mmap
import os
import secrets
import struct
import threading
import warnings

import numpy as np

from keras_replicator.communication import _ring_frames

ENVIRONMENT_VARIABLE = "KERAS_REPLICATOR_RING_SHARED_MEMORY"
DIRECTORY = "/dev/shm"
_OFFER = struct.Struct("!4s64s32s")  # magic, segment name ("" if none), token
_NOTE = struct.Struct("!4sQQ64s")  # magic, step, bytes, new segment name or ""
_ACK = struct.Struct("!4sQ")  # magic, step
_OFFER_MAGIC, _SHARED, _INLINE, _ACK_MAGIC = b"KRo1", b"KRs1", b"KRt1", b"KRa1"
_FIRST_SLOT = 1 << 20  # bytes; a slot grows to the largest step (doubling)


def enabled() -> bool:
    """Whether `KERAS_REPLICATOR_RING_SHARED_MEMORY` allows it (default: yes).

    Example:
    >>> isinstance(enabled(), bool)
    True
    """
    value = os.environ.get(ENVIRONMENT_VARIABLE, "1").strip().lower()
    if value in ("1", "true", "yes", ""):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ValueError(
        f"`{ENVIRONMENT_VARIABLE}` must be 1 (use shared memory between workers on "
        f"one machine) or 0 (sockets only). Received: {ENVIRONMENT_VARIABLE}="
        f"{os.environ[ENVIRONMENT_VARIABLE]!r}."
    )


class _Segment:
    """A mapped file of `/dev/shm`: two slots of `slot_bytes`."""

    def __init__(self, name: str, slot_bytes: int, create: bool):
        path = os.path.join(DIRECTORY, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        descriptor = os.open(path, flags, 0o600)
        try:
            if create:
                os.posix_fallocate(descriptor, 0, 2 * slot_bytes)
            # Pages mapped up front: the first call does not fault them in.
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self.map = mmap.mmap(descriptor, 2 * slot_bytes, flags=flags)
        except BaseException:
            if create:  # nobody else knows its name: it must not stay
                _unlink(path)
            raise
        finally:
            os.close(descriptor)
        self.name, self.path, self.slot_bytes = name, path, slot_bytes

    @classmethod
    def create(cls, slot_bytes: int) -> _Segment:
        return cls(f"krring-{os.getpid()}-{secrets.token_hex(8)}", slot_bytes, True)

    def view(self, step: int, dtype, elements: int, offset: int = 0) -> np.ndarray:
        start = (step % 2) * self.slot_bytes + offset
        return np.frombuffer(self.map, dtype, elements, start)

    def unlink(self) -> None:  # the neighbour may have unlinked it once mapped
        _unlink(self.path)

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:
            pass  # a view is still alive; the mapping goes with it


class Link:
    """One worker's shared-memory ends: `outbox` (to rank + 1), `inbox` (from rank - 1).

    Either may be None: that direction carries plain socket payloads (both None:
    `_ring_frames.exchange`, the socket ring as it was before shared memory).
    """

    def __init__(self, outbox: _Segment | None, inbox: _Segment | None):
        self.outbox, self.inbox = outbox, inbox
        self._sent = self._acked = self._received = 0  # steps
        self._too_large = None  # the slot size that could not be reserved

    def close(self) -> None:
        for segment in (self.outbox, self.inbox):
            if segment is not None:
                segment.unlink()
                segment.close()
        self.outbox = self.inbox = None

    # ------------------------------------------------------------- one ring step
    def exchange(self, sockets, rank, size, outgoing, incoming, deadline, header, plus):
        """`_ring_frames.exchange` with payloads in shared memory where mapped.

        `plus`: arrays added to `incoming` once received (the reduce phase), in
        one pass with the read when it comes from shared memory.
        """
        if self.outbox is None and self.inbox is None:  # sockets only, as ever
            sent = _ring_frames.exchange(
                sockets, rank, size, outgoing, incoming, deadline, header
            )
            add_into(incoming, plus)
            return sent
        sock, source = sockets
        left, right = (rank - 1) % size, (rank + 1) % size
        if header is not None:  # both checked before any data, as over TCP
            _closed_is(right, _ring_frames.send_all, sock, [header], deadline)
            theirs = _closed_is(
                left, _ring_frames.receive_exact, source, len(header), deadline
            )
            _ring_frames.check_header(theirs, header, rank, left)
        inline_send = self._post(sock, outgoing, deadline, right)
        thread, errors = None, []
        if inline_send is not None:  # large: sent while receiving, as over TCP
            thread = threading.Thread(
                target=_send_catching, args=(sock, inline_send, deadline, errors)
            )
            thread.daemon = True
            thread.start()
        try:
            self._take(source, incoming, plus, deadline, left, rank)
        except BaseException:
            if thread is not None:
                _ring_frames.shut_down(*sockets)
                thread.join()
            raise
        if thread is not None:
            thread.join()
            if errors and isinstance(errors[0], ConnectionError):
                raise ConnectionError(f"worker {right} closed its connection")
            if errors:
                raise errors[0]
        return sum(a.nbytes for a in outgoing)

    def _post(self, sock, outgoing, deadline, right):
        """Writes `outgoing` to the outbox and sends its note; or returns the
        byte views to send through the socket (no outbox, or it cannot grow)."""
        step, size = self._sent + 1, sum(a.nbytes for a in outgoing)
        views = [memoryview(a.reshape(-1).view(np.uint8)) for a in outgoing]
        if self.outbox is None:
            self._sent = step
            return views
        self._wait_for_ack(sock, step - 2, deadline, right)
        grown, name = self._fit(sock, size, step, deadline, right), b""
        if grown is None:  # no room: this step through the socket
            _closed_is(
                right,
                _ring_frames.send_all,
                sock,
                [_NOTE.pack(_INLINE, step, size, b"")],
                deadline,
            )
            self._sent = step
            return views
        if grown:
            name = self.outbox.name.encode()
        offset = 0
        for a in outgoing:
            flat = a.reshape(-1).view(np.uint8)
            self.outbox.view(step, np.uint8, flat.size, offset)[...] = flat
            offset += flat.size
        note = _NOTE.pack(_SHARED, step, size, name)
        _closed_is(right, _ring_frames.send_all, sock, [note], deadline)
        self._sent = step
        return None

    def _fit(self, sock, size, step, deadline, right):
        """Grows the outbox to hold `size` bytes: True if it grew, None if it cannot
        (then, as for every larger step after it, without trying again)."""
        if size <= self.outbox.slot_bytes:
            return False
        slot = self.outbox.slot_bytes
        while slot < size:
            slot *= 2
        if self._too_large is not None and slot >= self._too_large:
            return None
        self._wait_for_ack(sock, step - 1, deadline, right)  # both slots read
        try:
            segment = _Segment.create(slot)
        except OSError as error:
            self._too_large = slot
            warnings.warn(
                f"The socket ring could not grow its shared memory to {2 * slot} "
                f"bytes in {DIRECTORY} ({error}); steps that large go through the "
                "socket. Give the machine a larger /dev/shm to keep them fast.",
                stacklevel=2,
            )
            return None
        self.outbox.unlink()
        self.outbox.close()
        self.outbox = segment
        return True

    def _wait_for_ack(self, sock, step, deadline, right):
        while self._acked < step:
            frame = _closed_is(
                right, _ring_frames.receive_exact, sock, _ACK.size, deadline
            )
            magic, acked = _ACK.unpack(frame)
            if magic != _ACK_MAGIC or acked != self._acked + 1:
                raise _ring_frames.FrameMismatch(
                    f"worker {right} acknowledged {frame!r}, not step "
                    f"{self._acked + 1} of the shared-memory link"
                )
            self._acked = acked

    def _take(self, source, incoming, plus, deadline, left, rank):
        """Receives this step's note and data from the left; acks shared data."""
        step, size = self._received + 1, sum(a.nbytes for a in incoming)
        views = [memoryview(a.reshape(-1).view(np.uint8)) for a in incoming]
        if self.inbox is None:
            _closed_is(left, _ring_frames.receive_into, source, views, deadline)
            self._received = step
            add_into(incoming, plus)
            return
        frame = _closed_is(
            left, _ring_frames.receive_exact, source, _NOTE.size, deadline
        )
        magic, theirs, sent, name = _NOTE.unpack(frame)
        if magic not in (_SHARED, _INLINE) or theirs != step or sent != size:
            raise _ring_frames.FrameMismatch(
                f"worker {left} sent step {theirs} of {sent} bytes ({magic!r}) where "
                f"worker {rank} expected step {step} of {size} bytes: the workers' "
                "calls differ"
            )
        if magic == _INLINE:
            _closed_is(left, _ring_frames.receive_into, source, views, deadline)
            add_into(incoming, plus)
        else:
            if name.rstrip(b"\0"):
                self._attach(name.rstrip(b"\0").decode())
            self._read(step, incoming, plus)
        self._received = step
        try:
            _ring_frames.send_all(source, [_ACK.pack(_ACK_MAGIC, step)], deadline)
        except ConnectionError:
            # The data is here: this call is complete. A neighbour that closed
            # after its last call (a worker exiting) needs no ack; one that still
            # waits for it fails on its own, and so does this worker's next call.
            pass

    def _attach(self, name: str) -> None:
        """Maps the left neighbour's new (larger) segment in place of the old."""
        path = os.path.join(DIRECTORY, name)
        try:
            segment = _Segment(name, os.stat(path).st_size // 2, create=False)
        finally:
            _unlink(path)  # mapped or not: nothing left behind
        self.inbox.close()
        self.inbox = segment

    def _read(self, step, incoming, plus) -> None:
        offset = 0
        for index, part in enumerate(incoming):
            flat = part.reshape(-1)
            shared = self.inbox.view(step, flat.dtype, flat.size, offset)
            offset += flat.nbytes
            if plus is None:
                flat[...] = shared
            else:
                _sum_into(flat, shared, plus[index].reshape(-1))


def open_link(send, receive, deadline, step_bytes: int = 0) -> Link:
    """Offers this worker's segment to its right neighbour and maps its left's.

    Call on every worker at once, right after the ring's sockets are proven
    (`_ring_frames.open_ring`): every frame is small, so no worker blocks.
    `step_bytes`: the largest step expected (a bucket's chunk), so that the
    first calls need not grow the segment; it grows past it when needed.
    """
    outbox, use = None, enabled()
    if use:
        slot = _FIRST_SLOT
        while slot < step_bytes:
            slot *= 2
        try:
            outbox = _Segment.create(slot)
        except OSError:
            outbox = None  # no /dev/shm here: plain sockets
    token = secrets.token_bytes(32)
    name = b"" if outbox is None else outbox.name.encode()
    if outbox is not None:
        outbox.view(0, np.uint8, 32)[...] = np.frombuffer(token, np.uint8)
    try:
        _ring_frames.send_all(send, [_OFFER.pack(_OFFER_MAGIC, name, token)], deadline)
        offer = _ring_frames.receive_exact(receive, _OFFER.size, deadline)
        inbox = _map_offer(offer) if use else None
        _ring_frames.send_all(receive, [b"Y" if inbox else b"N"], deadline)
        if _ring_frames.receive_exact(send, 1, deadline) != b"Y" and outbox:
            outbox.unlink()
            outbox.close()
            outbox = None
    except BaseException:
        Link(outbox, None).close()
        raise
    return Link(outbox, inbox)


def _map_offer(offer: bytes):
    magic, name, token = _OFFER.unpack(offer)
    name = name.rstrip(b"\0").decode(errors="replace")
    if magic != _OFFER_MAGIC or not name or "/" in name:
        return None
    try:
        size = os.stat(os.path.join(DIRECTORY, name)).st_size
        if size < 2 * _FIRST_SLOT or size % 2:
            return None  # not a segment of ours
        segment = _Segment(name, size // 2, create=False)
    except (OSError, ValueError):
        return None  # another machine, or no access
    if bytes(segment.view(0, np.uint8, 32)) != token:
        segment.close()
        return None  # a file of the same name on this machine is not theirs
    segment.unlink()
    return segment


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def add_into(incoming, plus) -> None:
    """Adds each of `plus` into the matching array of `incoming` (16-bit in float32)."""
    for part, own in zip(incoming, plus or ()):
        _sum_into(part, part, own)


def _sum_into(out, a, b) -> None:
    """`out = a + b`; 16-bit floats added in float32 (numpy has no fast 16-bit add)."""
    if out.dtype.itemsize < 4:
        out[...] = (a.astype(np.float32) + b.astype(np.float32)).astype(out.dtype)
    else:
        np.add(a, b, out=out)


def _send_catching(sock, views, deadline, errors) -> None:
    try:
        _ring_frames.send_all(sock, views, deadline)
    except OSError as error:
        errors.append(error)


def _closed_is(worker, function, *args):
    """`function(*args)`; a closed connection is named after `worker`."""
    try:
        return function(*args)
    except ConnectionError as error:
        if isinstance(error, _ring_frames.HandshakeError):
            raise
        raise ConnectionError(f"worker {worker} closed its connection") from error
