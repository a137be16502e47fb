"""Who gets into the socket ring: the job's secret, proven by every connection.

The ring's listening port is reachable by anyone who can reach the worker's
address, and the first process to connect used to be taken as the ring neighbour
(its bytes were added into the gradients; issue 22). Every worker now adds
random words to the table the strategy already all-reduces to exchange the ports
(`secret_words`), and all of them hash the same table into one per-job secret
(`derive_secret`). Each connection then proves it both ways with HMAC-SHA256
challenge-response over fresh nonces (`prove_to_listener` / `greeting` and
`check_reply`), each connection within `HANDSHAKE_TIMEOUT`. This authenticates
the ring's connections; it does not encrypt them (gradients travel in clear, as
over TensorFlow's gRPC ports), and the secret itself travels over TensorFlow's
collectives, so whoever can read those ports can read it.

The listener serves every connection at once (`accept_neighbour`, issue 34): it
used to take them one at a time and give each 5 s to prove the secret, so four
silent connections (or a full accept queue) used up the setup time and a
stranger that knew no secret could make every worker fall back. Now each pending
connection has its own `HANDSHAKE_TIMEOUT`, a silent one delays no other, the
neighbour is in as soon as it proves the secret, and what was refused is named
in a warning (or in the error, `describe`).

Hand-written because TLS (`ssl`) would need a certificate per job and encrypt
every byte (the ring's rate is the point); `hmac` and `hashlib` do the
cryptography.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import selectors
import struct
import time
import warnings

import numpy as np

from keras_replicator.communication.ring import _frames

MAX_PENDING = 128  # connections proving the secret at once (file descriptors)
STRANGERS = "did not prove the job's secret"
# 16-bit words are exact in the float32 table the strategy all-reduces (24-bit
# significand); 16 of them give each worker 256 random bits.
SECRET_WORDS = 16
HANDSHAKE_TIMEOUT = 5.0  # seconds one connection may take to prove the secret
_HELLO = b"KRRING1\n"
_NONCE = 32
_MAC = 32


class HandshakeError(ConnectionError):
    """A connection that did not prove the job's secret."""


def secret_words() -> list[float]:
    """This worker's random contribution to the shared table (exact in float32)."""
    return [float(w) for w in np.frombuffer(os.urandom(2 * SECRET_WORDS), np.uint16)]


def derive_secret(words) -> bytes:
    """The job's secret from every worker's `secret_words` (a table, one row each).

    Example:
    >>> table = [[1.0] * SECRET_WORDS, [2.0] * SECRET_WORDS]
    >>> derive_secret(table) == derive_secret([list(r) for r in table])
    True
    """
    values = np.rint(np.asarray(words, np.float64)).astype(">u4")
    return hashlib.sha256(
        b"keras_replicator ring secret 1\0" + values.tobytes()
    ).digest()


def _mac(secret, role, left, right, listener_nonce, connector_nonce) -> bytes:
    message = role + struct.pack("!II", left, right) + listener_nonce + connector_nonce
    return hmac.new(secret, message, hashlib.sha256).digest()


def prove_to_listener(sock, secret: bytes, rank: int, right: int, deadline) -> None:
    """The connecting side: proves the secret to `right` and checks its proof."""
    hello = _frames.receive_exact(sock, len(_HELLO) + _NONCE, deadline)
    if not hello.startswith(_HELLO):
        raise HandshakeError("the listener did not greet as a ring worker")
    theirs, mine = hello[len(_HELLO) :], os.urandom(_NONCE)
    _frames.send_all(
        sock, [mine + _mac(secret, b"C", rank, right, theirs, mine)], deadline
    )
    proof = _frames.receive_exact(sock, _MAC, deadline)
    if not hmac.compare_digest(proof, _mac(secret, b"L", rank, right, theirs, mine)):
        raise HandshakeError("the listener did not prove the job's secret")


def greeting() -> tuple[bytes, bytes]:
    """The listening side's first frame, and its nonce for `check_reply`."""
    nonce = os.urandom(_NONCE)
    return _HELLO + nonce, nonce


REPLY_SIZE = _NONCE + _MAC  # the connecting side's reply to `greeting`


def check_reply(reply: bytes, secret: bytes, rank: int, left: int, nonce) -> bytes:
    """Checks that `reply` to the greeting with `nonce` comes from worker `left`.

    Returns:
        The listener's own proof, to send back.

    Raises:
        HandshakeError: If the reply does not prove the job's secret.
    """
    theirs, proof = reply[:_NONCE], reply[_NONCE:]
    if not hmac.compare_digest(proof, _mac(secret, b"C", left, rank, nonce, theirs)):
        raise HandshakeError("it did not prove the job's secret")
    return _mac(secret, b"L", left, rank, nonce, theirs)


# ------------------------------------------------------------------ the listener
class _Pending:
    """A connection proving the secret: its greeting's nonce, its reply so far."""

    def __init__(self, peer, nonce, expires):
        self.peer, self.nonce, self.expires = peer, nonce, expires
        self.reply = b""


def accept_neighbour(
    server, secret: bytes, rank: int, left: int, deadline, refused=None
):
    """Accepts connections until one proves the secret; closes the others.

    Every connection is greeted as soon as it is accepted and has
    `HANDSHAKE_TIMEOUT` to reply, all at once (one selector), so
    silent connections delay no other. The refused ones are named in one warning,
    and appended to `refused` (a list) if given.

    Returns:
        The connected socket from worker `left` (blocking).

    Raises:
        TimeoutError: If no connection proved the secret before `deadline`,
            naming the connections that did not.
    """
    port = server.getsockname()[1]
    pending, refused = {}, [] if refused is None else refused
    selector = selectors.DefaultSelector()
    server.setblocking(False)
    selector.register(server, selectors.EVENT_READ)

    def refuse(connection, reason):
        selector.unregister(connection)
        peer = pending.pop(connection).peer
        connection.close()
        refused.append(f"{peer[0]}:{peer[1]} ({reason})")

    try:
        while True:
            now = time.monotonic()
            for connection in [c for c, p in pending.items() if p.expires <= now]:
                refuse(connection, f"silent for {HANDSHAKE_TIMEOUT:g} s")
            if now >= deadline:
                raise TimeoutError(
                    f"worker {left} did not connect and prove the job's secret in "
                    f"time.{describe(refused, port)}"
                )
            wait = min([deadline] + [p.expires for p in pending.values()]) - now
            for key, _ in selector.select(wait):
                connection = key.fileobj
                if connection is server:
                    for connection, peer in _accept_all(server):
                        if len(pending) >= MAX_PENDING:  # a flood: one at random
                            refuse(random.choice(list(pending)), "too many at once")
                        hello, nonce = greeting()
                        expires = time.monotonic() + HANDSHAKE_TIMEOUT
                        pending[connection] = _Pending(
                            peer, nonce, min(expires, deadline)
                        )
                        selector.register(connection, selectors.EVENT_READ)
                        if not _send_small(connection, hello):
                            refuse(connection, "it did not take the greeting")
                    continue
                if connection not in pending:  # refused above, in this round
                    continue
                proven = _read_reply(
                    connection, pending[connection], secret, rank, left
                )
                if isinstance(proven, str):
                    refuse(connection, proven)
                elif proven:
                    selector.unregister(connection)
                    del pending[connection]
                    connection.setblocking(True)
                    return connection
    finally:
        for connection in list(pending):
            refuse(connection, "silent until the neighbour proved it")
        selector.close()
        if refused:
            count = (
                "a connection" if len(refused) == 1 else f"{len(refused)} connections"
            )
            warnings.warn(
                f"The socket ring of worker {rank} refused {count} to its port "
                f"{port} that {STRANGERS}: {_list(refused)}. Only the ring neighbour, "
                "which knows this job's secret, is accepted.",
                stacklevel=3,
            )


def _accept_all(server):
    """The connections waiting in `server`'s queue, non-blocking."""
    while True:
        try:
            connection, peer = server.accept()
        except (BlockingIOError, InterruptedError):
            return
        connection.setblocking(False)
        yield connection, peer


def _send_small(connection, frame: bytes) -> bool:
    """Sends a frame that fits a fresh socket's buffer, without blocking."""
    try:
        return connection.send(frame) == len(frame)
    except OSError:
        return False


def _read_reply(connection, pending: _Pending, secret, rank, left):
    """Reads what arrived: True once proven, False if more is due, else the reason."""
    try:
        data = connection.recv(REPLY_SIZE - len(pending.reply))
    except (BlockingIOError, InterruptedError):
        return False
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    if not data:
        return "it closed the connection"
    pending.reply += data
    if len(pending.reply) < REPLY_SIZE:
        return False
    try:
        proof = check_reply(pending.reply, secret, rank, left, pending.nonce)
    except HandshakeError as error:
        return str(error)
    return _send_small(connection, proof) or "it did not take the proof"


def describe(refused, port) -> str:
    if not refused:
        return ""
    return (
        f" {len(refused)} connection(s) to port {port} {STRANGERS}: {_list(refused)}."
    )


def _list(refused, shown: int = 5) -> str:
    more = f"; and {len(refused) - shown} more" if len(refused) > shown else ""
    return "; ".join(refused[:shown]) + more
