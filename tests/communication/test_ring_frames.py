"""The socket ring's wire: the secret, the handshake, the call header, deadlines."""

import socket
import threading
import time

import numpy as np
import pytest

from keras_replicator.communication.ring import _frames, _handshake

SECRET = _handshake.derive_secret([[1.0] * _handshake.SECRET_WORDS] * 2)


def test_every_worker_derives_the_same_secret_from_every_workers_words():
    table = np.array(
        [_handshake.secret_words() for _ in range(3)], np.float32
    )  # as the strategy's all-reduce delivers it
    assert _handshake.derive_secret(table) == _handshake.derive_secret(
        table.astype(np.float64).tolist()
    )
    for row in range(3):  # each worker's words change it
        changed = table.copy()
        changed[row, 0] = (changed[row, 0] + 1) % 65536
        assert _handshake.derive_secret(changed) != _handshake.derive_secret(table)
    assert all(0 <= w < 65536 and w == int(w) for w in table.ravel())


def _listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server, server.getsockname()


def _in_thread(function, *args):
    outcome = {}

    def run():
        try:
            outcome["value"] = function(*args)
        except Exception as error:  # noqa: BLE001 - checked by the test
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_the_handshake_opens_with_the_secret_and_refuses_another():
    server, address = _listener()
    deadline = time.monotonic() + 5
    thread, accepted = _in_thread(
        _handshake.accept_neighbour, server, SECRET, 1, 0, deadline
    )
    client = socket.create_connection(address, timeout=5)
    _handshake.prove_to_listener(client, SECRET, 0, 1, deadline)
    thread.join(5)
    assert "value" in accepted, accepted
    accepted["value"].close()
    client.close()
    # The wrong secret: the listener refuses it, and the connector learns it.
    other = _handshake.derive_secret([[2.0] * _handshake.SECRET_WORDS])
    deadline = time.monotonic() + 1.0
    with pytest.warns(UserWarning, match="refused a connection"):
        thread, accepted = _in_thread(
            _handshake.accept_neighbour, server, SECRET, 1, 0, deadline
        )
        client = socket.create_connection(address, timeout=5)
        with pytest.raises(ConnectionError):
            _handshake.prove_to_listener(client, other, 0, 1, deadline)
        thread.join(5)
    assert isinstance(accepted.get("error"), TimeoutError), accepted
    assert "did not prove the job's secret" in str(accepted["error"])
    server.close()


def test_a_listener_without_the_secret_is_refused_by_the_connector():
    server, address = _listener()

    def impostor():  # greets like a ring worker, then answers garbage
        connection, _ = server.accept()
        connection.sendall(b"KRRING1\n" + bytes(32))
        connection.recv(64)
        connection.sendall(bytes(32))
        time.sleep(1)
        connection.close()

    threading.Thread(target=impostor, daemon=True).start()
    client = socket.create_connection(address, timeout=5)
    with pytest.raises(_handshake.HandshakeError, match="did not prove"):
        _handshake.prove_to_listener(client, SECRET, 0, 1, time.monotonic() + 5)
    client.close()
    server.close()


def test_the_header_names_both_sides():
    mine = _frames.header(3, np.float32, 16)
    theirs = _frames.header(3, np.float64, 8)
    assert len(mine) == _frames.HEADER_SIZE
    _frames.check_header(mine, mine, 1, 0)
    with pytest.raises(_frames.FrameMismatch) as caught:
        _frames.check_header(theirs, mine, 1, 0)
    message = str(caught.value)
    assert "worker 0 sent call 3: float64[8] (64 bytes)" in message
    assert "worker 1 has call 3: float32[16] (64 bytes)" in message
    with pytest.raises(_frames.FrameMismatch, match="not a ring header"):
        _frames.check_header(bytes(len(mine)), mine, 1, 0)
    with pytest.raises(_frames.FrameMismatch, match="call 4"):
        _frames.check_header(_frames.header(4, np.float32, 16), mine, 1, 0)


def test_the_header_names_the_operation_of_both_sides():
    for operation in _frames.OPERATIONS:
        frame = _frames.header(2, np.float32, 4, operation)
        assert len(frame) == _frames.HEADER_SIZE
        assert (
            _frames.describe(frame) == f"call 2: float32[4] (16 bytes) in {operation}"
        )
    mine = _frames.header(2, np.float32, 8, "reduce_scatter")
    theirs = _frames.header(2, np.float32, 8, "all_reduce")
    with pytest.raises(_frames.FrameMismatch) as caught:
        _frames.check_header(theirs, mine, 1, 0)
    message = str(caught.value)
    assert message.startswith("the operations differ between workers: ")
    assert "worker 0 sent call 2: float32[8] (32 bytes) in all_reduce" in message
    assert "worker 1 has call 2: float32[8] (32 bytes) in reduce_scatter" in message
    with pytest.raises(ValueError, match=r"Received: operation='all_to_all'"):
        _frames.header(2, np.float32, 8, "all_to_all")


def test_receiving_has_one_deadline_for_all_its_bytes():
    a, b = socket.socketpair()

    def trickle():
        for _ in range(30):
            try:
                b.sendall(b"x")
            except OSError:
                return
            time.sleep(0.05)

    threading.Thread(target=trickle, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        _frames.receive_exact(a, 100, time.monotonic() + 0.5)
    assert time.monotonic() - start < 1.0
    a.close()
    b.close()
