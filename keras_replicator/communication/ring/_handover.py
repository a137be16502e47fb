"""How a worker hands its shared-memory segment to its right neighbour (issue 34).

The segment (`_memfd.Segment`, an anonymous memfd) travels as a descriptor with
`SCM_RIGHTS` over a Unix stream connection in the abstract namespace (no file
either). Each worker binds a listener under a random name (`listen`) and tells
its neighbours the name, its pid and a random token over their proven TCP
connections (`open_ends`); the left neighbour connects (`connect`: on another
machine or network namespace the name does not exist, and that link keeps socket
payloads), checks with `SO_PEERCRED` that the listener is the pid it was told and
our user, and sends the descriptor (`send`), which completes into the kernel's
buffers before the listener accepts, so no worker waits on another. The listener
accepts only a connection whose `SO_PEERCRED` pid is its left neighbour's
(`accept`; anyone may connect to an abstract name), checks the descriptor
(`receive`, `_memfd.Segment.adopt`) and the token written in the memory. The
connection stays open for the link's life: a grown segment is a new descriptor on
it, named by nothing on the wire. Before, a grown segment's note carried a name
that the receiver joined onto `/dev/shm` and opened, mapped and unlinked, so a
misbehaving neighbour could make a worker delete any file it may delete.
"""

from __future__ import annotations

import array
import os
import secrets
import socket
import struct
import time
import warnings

import numpy as np

from keras_replicator.communication.ring import _frames
from keras_replicator.communication.ring._memfd import Refused, Segment

FIRST_SLOT = 1 << 20  # bytes; a slot grows to the largest step (doubling)
_FRAME = struct.Struct("!4sQ")  # magic, step (0: when the link opens)
# magic, pid, 1 if it offers a segment, its listener's abstract name, the token
_HELLO = struct.Struct("!4sIB48s32s")
_HELLO_MAGIC = b"KRo2"
_NAME_PREFIX = b"\0krring-"  # abstract names only: never a path on the disk
_MAGIC = b"KRf1"
_CREDENTIALS = struct.Struct("3i")  # pid, uid, gid (struct ucred)
_CONNECT_TIMEOUT = 1.0  # seconds; a full backlog means a stranger got there first


# ---------------------------------------------------------------- opening a link
def open_ends(send, receive, deadline, step_bytes: int, use: bool = True):
    """This worker's `(outbox, inbox, sending, receiving)` for `_shared_memory.Link`.

    Over the proven TCP connections `send` (to rank + 1) and `receive` (from
    rank - 1), every worker at once: tell both neighbours a hello (pid, token,
    listener name), hand the outbox to the right (`_hand_over`), say whether it
    went (Y/N), take the left's if it said so (`_take_over`), say whether it is
    mapped. Every frame is small and a hand-over completes into the kernel's
    buffers, so no worker blocks on another. A link that fails any check keeps
    socket payloads (its ends None). `use`: False sends a hello that offers and
    takes nothing (shared memory off or unsupported here).
    """
    outbox = listener = sending = receiving = inbox = None
    name, token = b"", secrets.token_bytes(32)
    if use:
        slot = FIRST_SLOT
        while slot < step_bytes:
            slot *= 2
        try:
            outbox = Segment.create(slot)
            listener, name = listen()
        except OSError:  # no memory to spare, or no Unix sockets: plain sockets
            for end in (outbox, listener):
                if end is not None:
                    end.close()
            outbox = listener = None
            name = b""
    if outbox is not None:
        outbox.view(0, np.uint8, 32)[...] = np.frombuffer(token, np.uint8)
    mine = _HELLO.pack(_HELLO_MAGIC, os.getpid(), outbox is not None, name, token)
    try:
        _frames.send_all(send, [mine], deadline)
        _frames.send_all(receive, [mine], deadline)
        right = _hello(_frames.receive_exact(send, _HELLO.size, deadline))
        left = _hello(_frames.receive_exact(receive, _HELLO.size, deadline))
        if outbox is not None and right is not None and right[2]:
            sending = _hand_over(outbox, right, deadline)
        if outbox is not None:
            outbox.release()  # handed over (or not): no descriptor left to open
        _frames.send_all(send, [b"Y" if sending else b"N"], deadline)
        handed = _frames.receive_exact(receive, 1, deadline) == b"Y"
        if handed and listener is not None and left is not None and left[1]:
            inbox, receiving = _take_over(listener, left, deadline)
        _frames.send_all(receive, [b"Y" if inbox else b"N"], deadline)
        mapped = _frames.receive_exact(send, 1, deadline) == b"Y"
        if not mapped or sending is None:
            for end in (outbox, sending):
                if end is not None:
                    end.close()
            outbox = sending = None
    except BaseException:
        for end in (outbox, inbox, sending, receiving):
            if end is not None:
                end.close()
        raise
    finally:
        if listener is not None:
            listener.close()  # the link's connections are made: no one else
    return outbox, inbox, sending, receiving


def _hello(frame: bytes):
    """A neighbour's `(pid, offers, listener name, token)`; None if not a hello."""
    magic, pid, offers, name, token = _HELLO.unpack(frame)
    name = name.rstrip(b"\0")
    if magic != _HELLO_MAGIC or (name and not name.startswith(_NAME_PREFIX)):
        return None
    return pid, bool(offers), name, token


def _hand_over(outbox, right, deadline):
    """Connects to the right neighbour's listener and sends the outbox: the
    connection, or None (another machine, or not the neighbour's process)."""
    pid, _, name, _ = right
    try:
        channel = connect(name, pid, deadline)
    except (TimeoutError, BlockingIOError, Refused) as error:
        # The listener exists on this machine but did not answer as the
        # neighbour: its backlog was full or another process holds its name.
        # Anyone on the machine can see and connect to an abstract name
        # (/proc/net/unix), so another user can cause this; say so.
        warnings.warn(
            "The shared-memory hand-over to the next worker on this machine "
            f"failed ({type(error).__name__}: {error}); its listener may have "
            "been flooded by another local process. This link sends its "
            "payloads over TCP instead (correct, slower).",
            stacklevel=2,
        )
        return None
    except OSError:  # no such name here: the neighbour is on another machine
        return None
    try:
        send(channel, outbox, 0, deadline)
    except OSError:
        channel.close()
        return None
    return channel


def _take_over(listener, left, deadline):
    """The left neighbour's segment and connection (already queued), or Nones."""
    pid, _, _, token = left
    channel = segment = None
    try:  # it connected before it said so: no need to wait long
        channel = accept(listener, pid, min(deadline, time.monotonic() + 1.0))
        segment = receive(channel, 0, FIRST_SLOT, deadline)
        if bytes(segment.view(0, np.uint8, 32)) == token:
            return segment, channel
    except (OSError, Refused):
        pass
    for end in (segment, channel):
        if end is not None:
            end.close()
    return None, None


# ----------------------------------------------------------------- the Unix channel
def listen() -> tuple[socket.socket, bytes]:
    """A listener in the abstract namespace, and its name (no file, no cleanup)."""
    name = f"\0krring-{os.getpid()}-{secrets.token_hex(8)}".encode()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(name)
        listener.listen(16)
    except BaseException:
        listener.close()
        raise
    return listener, name


def connect(name: bytes, pid: int, deadline) -> socket.socket:
    """Connects to the listener `name`, which must be process `pid` of our user.

    Raises `OSError` if the name does not exist here (another machine) or
    `Refused` if another process holds it.
    """
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        left = _remaining(deadline)
        channel.settimeout(
            _CONNECT_TIMEOUT if left is None else min(left, _CONNECT_TIMEOUT)
        )
        channel.connect(name)
        _check_peer(channel, pid, "the neighbour's listener")
    except BaseException:
        channel.close()
        raise
    return channel


def accept(listener, pid: int, deadline) -> socket.socket:
    """The connection from process `pid` of our user; closes any other first.

    Raises `TimeoutError` if it does not come before `deadline`.
    """
    while True:
        listener.settimeout(_remaining(deadline))
        channel, _ = listener.accept()
        try:
            _check_peer(channel, pid, "a connection")
            return channel
        except Refused:  # anyone can connect to an abstract name
            channel.close()


def send(channel, segment: Segment, step: int, deadline) -> None:
    """Sends `segment`'s descriptor for `step` (0: the first), then closes it."""
    channel.settimeout(_remaining(deadline))
    rights = [
        (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [segment.descriptor]))
    ]
    channel.sendmsg([_FRAME.pack(_MAGIC, step)], rights)
    segment.release()


def receive(channel, step: int, step_bytes: int, deadline) -> Segment:
    """The neighbour's segment for `step`, mapped read-only (`Segment.adopt`).

    Raises `Refused` if the frame or the descriptor is not the expected one,
    `ConnectionError` if the connection closed.
    """
    channel.settimeout(_remaining(deadline))
    space = socket.CMSG_SPACE(array.array("i").itemsize)
    flags = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
    data, ancillary, msg_flags, _ = channel.recvmsg(_FRAME.size, space, flags)
    descriptors = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % descriptors.itemsize
            descriptors.frombytes(payload[:usable])
    if not data and not descriptors:
        raise ConnectionError("the connection was closed")
    if len(descriptors) != 1 or msg_flags & getattr(socket, "MSG_CTRUNC", 0):
        for descriptor in descriptors:
            os.close(descriptor)
        raise Refused(f"{len(descriptors)} descriptors where one segment was due")
    try:
        if len(data) < _FRAME.size:  # a stream: the rest of the frame follows
            data += _frames.receive_exact(channel, _FRAME.size - len(data), deadline)
        magic, theirs = _FRAME.unpack(data)
        if magic != _MAGIC or theirs != step:
            raise Refused(f"a segment for step {theirs} ({magic!r}), not step {step}")
    except BaseException:
        os.close(descriptors[0])
        raise
    return Segment.adopt(descriptors[0], step_bytes)


def _check_peer(channel, pid: int, what: str) -> None:
    credentials = channel.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size
    )
    theirs, uid, _ = _CREDENTIALS.unpack(credentials)
    if theirs != pid or uid != os.getuid():
        raise Refused(
            f"{what} is process {theirs} of user {uid}, not the neighbour's "
            f"process {pid} of user {os.getuid()}"
        )


_remaining = _frames._remaining  # seconds left; TimeoutError if none
