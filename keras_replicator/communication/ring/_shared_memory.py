"""The socket ring's payloads through shared memory, between workers on one machine.

Why (issue 23): on one host, loopback TCP makes the kernel copy every byte twice and
run the TCP stack over it, on the cores that compute the step: a 25 MB all-reduce
between 2 processes took 12 ms where copying the bytes costs 1.4 ms and adding them
1.3 ms (docs/performance.md). As NCCL's SHM transport does within a node, each worker
writes what it sends into a segment its right neighbour has mapped, and the
neighbour reads (and adds) straight out of it: one copy and one pass per byte.

The sockets stay: each step is a small *note* on them (step, bytes, whether the
segment grew), answered by an *ack* once read, so all `_frames` guarantees
hold: proven connections, the call's header checked before any data, one deadline
per call, a dead or hung neighbour an error. A segment has two slots: a worker
writes step k + 1 while its neighbour reads step k, and waits for the ack of step
k - 1 before it writes over that slot again.

Which links use it is found out, not configured: when the ring opens, each worker
creates its segment (an anonymous memfd, `_memfd`: no file in `/dev/shm`, no name
on the wire), tells its neighbours over their proven connections its pid, a
random token and where to hand it a segment, and hands its own to its right
neighbour as a descriptor (`_handover`); the neighbour checks who sent it, its
seals and size, maps it and checks the token, and says whether it could.
Neighbours on other machines keep socket payloads on that link. Space is
reserved with `posix_fallocate` before any byte is written (a machine short of
memory would otherwise kill the process with SIGBUS); a segment that cannot grow
sends steps that large through the socket.
`KERAS_REPLICATOR_RING_SHARED_MEMORY=0` turns it off (as `NCCL_SHM_DISABLE`).

Fewer passes over memory (issue 36): the ring is bound by memory bandwidth, which
both workers share with each other and with the step. So a received chunk is
read once: block by block (`_passes`, while the block is in cache) it is
added to this worker's own chunk, divided by the sample count when it is the
call's final sum (`Finish`), and *staged*: written into the outbox slot of the
next ring step too, when what was received is what this worker sends next (a
partial sum it passes on, the summed chunk the all-gather starts with, a chunk
the all-gather forwards). That next step then sends its note without copying.
Before, the division and the copy into the outbox were passes of their own over
the chunk: 5.5 buffer lengths of memory traffic per worker for an all-reduce
between two workers, now 4. The bits do not change (each element is added and
divided exactly as before).

Hand-written: `multiprocessing.shared_memory` names its segments in `/dev/shm`
(issue 34) and cannot reserve space; `os`, `fcntl`, `socket` and libc's `mmap`
are all it needs.
"""

from __future__ import annotations

import os
import struct
import threading
import warnings

import numpy as np

from keras_replicator import _environment
from keras_replicator.communication.ring import (
    _frames,
    _handover,
    _handshake,
    _memfd,
    _passes,
)

ENVIRONMENT_VARIABLE = _environment.RING_SHARED_MEMORY
_NOTE = struct.Struct("!4sQQ")  # magic (shared, grown or inline), step, bytes
_ACK = struct.Struct("!4sQ")  # magic, step
_ACK_MAGIC = b"KRa1"
_SHARED, _GROWN, _INLINE = b"KRs2", b"KRg2", b"KRt2"


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


class Link:
    """One worker's shared-memory ends: `outbox` (to rank + 1), `inbox` (from rank - 1).

    Either may be None: that direction carries plain socket payloads (both None:
    `_frames.exchange`, the socket ring as it was before shared memory).
    `sending` / `receiving`: the Unix connections that carry a grown segment's
    descriptor to rank + 1 / from rank - 1 (with the outbox / the inbox).
    `staged_steps`: the steps sent without a copy, staged as they were received.
    """

    def __init__(self, outbox, inbox, sending=None, receiving=None):
        self.outbox, self.inbox = outbox, inbox
        self._sending, self._receiving = sending, receiving
        self._sent = self._acked = self._received = 0  # steps
        self._too_large = None  # the slot size that could not be reserved
        self._staged = None  # (step, bytes) already in the outbox for that step
        self.staged_steps = 0

    def close(self) -> None:
        for end in (self.outbox, self.inbox, self._sending, self._receiving):
            if end is not None:
                end.close()
        self.outbox = self.inbox = self._sending = self._receiving = None

    # ------------------------------------------------------------- one ring step
    def exchange(
        self,
        sockets,
        rank,
        size,
        outgoing,
        incoming,
        deadline,
        header,
        plus,
        finish=None,
        stage=False,
    ):
        """`_frames.exchange` with payloads in shared memory where mapped.

        `plus`: arrays added to `incoming` once received (the reduce phase), in
        one pass with the read when it comes from shared memory. `finish`: a
        `Finish` for the reduce's final step (divided in that pass where it can
        be; `finish.applied` says). `stage`: `incoming` is what the next step
        sends, so it is also written into the outbox while in cache.
        """
        if self.outbox is None and self.inbox is None:  # sockets only, as ever
            sent = _frames.exchange(
                sockets, rank, size, outgoing, incoming, deadline, header
            )
            _passes.add_into(incoming, plus)
            return sent
        sock, source = sockets
        left, right = (rank - 1) % size, (rank + 1) % size
        if header is not None:  # both checked before any data, as over TCP
            _closed_is(right, _frames.send_all, sock, [header], deadline)
            theirs = _closed_is(
                left, _frames.receive_exact, source, len(header), deadline
            )
            _frames.check_header(theirs, header, rank, left)
        inline_send = self._post(sock, outgoing, deadline, right)
        thread, errors = None, []
        if inline_send is not None:  # large: sent while receiving, as over TCP
            thread = threading.Thread(
                target=_send_catching, args=(sock, inline_send, deadline, errors)
            )
            thread.daemon = True
            thread.start()
        try:
            taking = (incoming, plus, deadline, left, rank, finish, stage)
            self._take(source, *taking, sock=sock, right=right)
        except BaseException:
            if thread is not None:
                _frames.shut_down(*sockets)
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
        if self._staged == (step, size):  # written while it was received
            self._staged = None
            self.staged_steps += 1
            note = _NOTE.pack(_SHARED, step, size)
            _closed_is(right, _frames.send_all, sock, [note], deadline)
            self._sent = step
            return None
        self._staged = None
        grown = self._fit(sock, size, step, deadline, right)
        if grown is None:  # no room: this step through the socket
            _closed_is(
                right,
                _frames.send_all,
                sock,
                [_NOTE.pack(_INLINE, step, size)],
                deadline,
            )
            self._sent = step
            return views
        offset = 0
        for a in outgoing:
            flat = a.reshape(-1).view(np.uint8)
            self.outbox.view(step, np.uint8, flat.size, offset)[...] = flat
            offset += flat.size
        note = _NOTE.pack(_GROWN if grown else _SHARED, step, size)
        _closed_is(right, _frames.send_all, sock, [note], deadline)
        self._sent = step
        return None

    def _fit(self, sock, size, step, deadline, right):
        """Grows the outbox to hold `size` bytes: True if it grew, None if it cannot
        (then, as for every larger step after it, without trying again).

        The new segment's descriptor goes to the right neighbour at once, on the
        link's Unix connection; the note of this step says to take it."""
        if size <= self.outbox.slot_bytes:
            return False
        slot = self.outbox.slot_bytes
        while slot < size:
            slot *= 2
        if self._too_large is not None and slot >= self._too_large:
            return None
        self._wait_for_ack(sock, step - 1, deadline, right)  # both slots read
        try:
            segment = _memfd.Segment.create(slot)
        except OSError as error:
            self._too_large = slot
            warnings.warn(
                f"The socket ring could not grow its shared memory to {2 * slot} "
                f"bytes ({error}); steps that large go through the socket. Give "
                "the workers more memory to keep them fast.",
                stacklevel=2,
            )
            return None
        try:
            _closed_is(right, _handover.send, self._sending, segment, step, deadline)
        except BaseException:
            segment.close()
            raise
        self.outbox.close()
        self.outbox = segment
        return True

    def _wait_for_ack(self, sock, step, deadline, right):
        while self._acked < step:
            frame = _closed_is(right, _frames.receive_exact, sock, _ACK.size, deadline)
            magic, acked = _ACK.unpack(frame)
            if magic != _ACK_MAGIC or acked != self._acked + 1:
                raise _frames.FrameMismatch(
                    f"worker {right} acknowledged {frame!r}, not step "
                    f"{self._acked + 1} of the shared-memory link"
                )
            self._acked = acked

    def _take(
        self,
        source,
        incoming,
        plus,
        deadline,
        left,
        rank,
        finish=None,
        stage=False,
        sock=None,
        right=None,
    ):
        """Receives this step's note and data from the left; acks shared data."""
        step, size = self._received + 1, sum(a.nbytes for a in incoming)
        views = [memoryview(a.reshape(-1).view(np.uint8)) for a in incoming]
        if self.inbox is None:
            _closed_is(left, _frames.receive_into, source, views, deadline)
            self._received = step
            _passes.add_into(incoming, plus)
            return
        frame = _closed_is(left, _frames.receive_exact, source, _NOTE.size, deadline)
        magic, theirs, sent = _NOTE.unpack(frame)
        if magic not in (_SHARED, _GROWN, _INLINE) or theirs != step or sent != size:
            raise _frames.FrameMismatch(
                f"worker {left} sent step {theirs} of {sent} bytes ({magic!r}) where "
                f"worker {rank} expected step {step} of {size} bytes: the workers' "
                "calls differ"
            )
        if magic == _INLINE:
            _closed_is(left, _frames.receive_into, source, views, deadline)
            _passes.add_into(incoming, plus)
        else:
            if magic == _GROWN:
                self._attach(step, size, deadline, left)
            if size > self.inbox.slot_bytes:
                raise _frames.FrameMismatch(
                    f"worker {left} sent step {step} of {size} bytes in a segment "
                    f"of {self.inbox.slot_bytes} bytes a slot"
                )
            staged_step = self._staging(size, stage)
            if staged_step is not None:  # its slot's last reader is done with it
                self._wait_for_ack(sock, staged_step - 2, deadline, right)
            self._read(step, incoming, plus, finish, staged_step)
        self._received = step
        try:
            _frames.send_all(source, [_ACK.pack(_ACK_MAGIC, step)], deadline)
        except ConnectionError:
            # The data is here: this call is complete. A neighbour that closed
            # after its last call (a worker exiting) needs no ack; one that still
            # waits for it fails on its own, and so does this worker's next call.
            pass

    def _attach(self, step, size, deadline, left) -> None:
        """Maps the left neighbour's new (larger) segment in place of the old."""
        try:
            segment = _closed_is(
                left, _handover.receive, self._receiving, step, size, deadline
            )
        except _memfd.Refused as error:
            raise _frames.FrameMismatch(
                f"worker {left} grew its shared memory with {error}"
            ) from error
        self.inbox.close()
        self.inbox = segment

    def _staging(self, size, stage):
        """The step whose outbox slot `stage` writes (the next this worker
        sends), or None: staging off, no outbox, or a slot too small for it.

        The caller waits for that slot's last reader first (the ack of the step
        before this one, normally long arrived)."""
        if not stage or self.outbox is None or size > self.outbox.slot_bytes:
            return None
        return self._sent + 1

    def _read(self, step, incoming, plus, finish=None, staged_step=None) -> None:
        """`incoming = inbox (+ plus)`; `finish` and staging as `exchange` says."""
        offsets, offset = [], 0
        for part in incoming:
            offsets.append(offset)
            offset += part.nbytes
        counts = finish.counts if finish is not None else 0
        sums = len(incoming) - counts

        def read(index, divisor=None):
            flat = incoming[index].reshape(-1)
            shared = self.inbox.view(step, flat.dtype, flat.size, offsets[index])
            own = None if plus is None else plus[index].reshape(-1)
            staged = None
            if staged_step is not None:
                where = offsets[index]
                staged = self.outbox.view(staged_step, flat.dtype, flat.size, where)
            _passes.read_blocks(flat, shared, own, divisor, staged)

        for index in range(sums, len(incoming)):  # the counts say what to divide by
            read(index)
        divisor = None
        if finish is not None:
            divisor = finish.divisor()
            finish.applied = divisor is not None and all(
                a.dtype in _passes.DIVIDED_HERE for a in incoming[:sums]
            )
            divisor = divisor if finish.applied else None
        for index in range(sums):
            read(index, divisor)
        if staged_step is not None:
            self._staged = (staged_step, offset)


def open_link(send, receive, deadline, step_bytes: int = 0) -> Link:
    """Hands this worker's segment to its right neighbour and takes its left's.

    Call on every worker at once, right after the ring's sockets are proven
    (`_setup.open_ring`); `_handover.open_ends` says how. `step_bytes`: the
    largest step expected (a bucket's chunk), so that the first calls need not
    grow the segment; it grows past it when needed.
    """
    use = enabled() and _memfd.supported()
    return Link(*_handover.open_ends(send, receive, deadline, step_bytes, use))


def _send_catching(sock, views, deadline, errors) -> None:
    try:
        _frames.send_all(sock, views, deadline)
    except OSError as error:
        errors.append(error)


def _closed_is(worker, function, *args):
    """`function(*args)`; a closed connection is named after `worker`."""
    try:
        return function(*args)
    except ConnectionError as error:
        if isinstance(error, _handshake.HandshakeError):
            raise
        raise ConnectionError(f"worker {worker} closed its connection") from error
