"""The socket ring's payloads through shared memory (issue 23), workers as threads.

Threads of one process map each other's segments exactly as processes of one
machine do (`/dev/shm`); the multi-worker tests (`test_socket_ring_multi_worker`)
run the same code between real worker processes, where it is the default.
"""

import os
import socket
import threading
import time

import ml_dtypes
import numpy as np
import pytest

from keras_replicator.communication import _shared_memory
from keras_replicator.communication._socket_ring import SocketRing
from tests.communication.test_socket_ring import _rings, _together

pytestmark = pytest.mark.timeout(60)


def _segments():
    """This process's segments (other engineers' rings may run at the same time)."""
    mine = f"krring-{os.getpid()}-"
    return {n for n in os.listdir(_shared_memory.DIRECTORY) if n.startswith(mine)}


def _linked_rings(size, timeout=10.0, refuse=()):
    """Rings whose links were opened as `SocketRing.connect` opens them.

    `refuse`: ranks that cannot map their left neighbour's segment (as on
    another machine): that link keeps socket payloads.
    """
    edges = [socket.socketpair() for _ in range(size)]  # edge r: r -> r + 1
    for pair in edges:
        for s in pair:
            s.settimeout(timeout)
    links, errors = [None] * size, []
    original = _shared_memory._map_offer

    def open_link(r):
        try:
            links[r] = _shared_memory.open_link(
                edges[r][0], edges[(r - 1) % size][1], time.monotonic() + timeout
            )
        except Exception as error:  # noqa: BLE001 - checked below
            errors.append(error)

    def map_offer(offer):
        refused = threading.current_thread().name in {f"open {r}" for r in refuse}
        return None if refused else original(offer)

    _shared_memory._map_offer = map_offer
    try:
        threads = [
            threading.Thread(target=open_link, args=(r,), name=f"open {r}")
            for r in range(size)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
    finally:
        _shared_memory._map_offer = original
    assert not errors, errors
    return [
        SocketRing(r, size, edges[r][0], edges[(r - 1) % size][1], link=links[r])
        for r in range(size)
    ]


def _integers(size, shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(-8, 8, shape).astype(dtype) for _ in range(size)]


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]
)
def test_sums_are_the_socket_rings_bit_for_bit(size, dtype):
    shapes = [(3, 5), (), (7,), (1, 1, 2)]  # chunks cross array borders
    inputs = [
        [
            np.random.default_rng(10 * r + i).normal(size=s).astype(dtype)
            for i, s in enumerate(shapes)
        ]
        for r in range(size)
    ]
    rings = _linked_rings(size)
    assert all(ring._link.outbox and ring._link.inbox for ring in rings)
    linked, errors, _ = _together(rings, lambda r, ring: ring.all_reduce(*inputs[r]))
    assert not any(errors), errors
    plain, errors, _ = _together(
        _rings(size), lambda r, ring: ring.all_reduce(*inputs[r])
    )
    for r in range(size):
        for a, b, shape in zip(linked[r], plain[r], shapes):
            assert a.shape == shape and a.dtype == dtype
            np.testing.assert_array_equal(
                a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
            )
    assert rings[0].bytes_sent == _rings_bytes(size, inputs)


def _rings_bytes(size, inputs):
    rings = _rings(size)
    _together(rings, lambda r, ring: ring.all_reduce(*inputs[r]))
    return rings[0].bytes_sent


def test_segments_grow_shrink_back_and_leave_nothing_in_dev_shm():
    before = _segments()
    rings = _linked_rings(2)
    assert _segments() == before  # each was unlinked once its neighbour mapped it
    sizes = [10, 3_000_000, 100, 5_000_000, 0, 7]  # chunks of 12 MB: slots grow
    for length in sizes:
        flats = _integers(2, length, np.float32, seed=length)
        out, errors, _ = _together(
            rings, lambda r, ring, flats=flats: ring.all_reduce(flats[r])
        )
        assert not any(errors), errors
        for result in out:
            np.testing.assert_array_equal(result[0], flats[0] + flats[1])
    assert rings[0]._link.outbox.slot_bytes >= 10_000_000
    assert _segments() == before
    for ring in rings:
        ring._fail(RuntimeError("closed by the test"))
    assert rings[0]._link is not None and rings[0]._link.outbox is None


@pytest.mark.parametrize("size", [2, 4])
def test_the_two_phases_go_through_shared_memory(size):
    flats = _integers(size, size * 9, np.float64, seed=size)
    rings = _linked_rings(size)
    gathered, errors, _ = _together(
        rings, lambda r, ring: ring.all_gather(ring.reduce_scatter(flats[r]))
    )
    assert not any(errors), errors
    for result in gathered:
        np.testing.assert_array_equal(result, sum(flats))


def test_a_link_that_cannot_map_keeps_socket_payloads():
    # Worker 1 cannot map worker 0's segment (another machine): link 0 -> 1 uses
    # the socket, links 1 -> 2 and 2 -> 0 shared memory, in one ring.
    rings = _linked_rings(3, refuse=[1])
    assert rings[0]._link.outbox is None and rings[1]._link.inbox is None
    assert rings[1]._link.outbox is not None and rings[0]._link.inbox is not None
    flats = _integers(3, 3_000_001, np.float32, seed=3)
    out, errors, _ = _together(rings, lambda r, ring: ring.all_reduce(flats[r]))
    assert not any(errors), errors
    for result in out:
        np.testing.assert_array_equal(result[0], sum(flats))


def test_a_segment_that_cannot_grow_sends_through_the_socket(monkeypatch):
    rings = _linked_rings(2)
    attempts = []

    def full(slot_bytes):
        attempts.append(slot_bytes)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_shared_memory._Segment, "create", staticmethod(full))
    flats = _integers(2, 2_000_000, np.float32, seed=4)  # chunks of 4 MB > 1 MB
    with pytest.warns(UserWarning, match="could not grow its shared memory"):
        for _ in range(3):
            out, errors, _ = _together(rings, lambda r, ring: ring.all_reduce(flats[r]))
            assert not any(errors), errors
            np.testing.assert_array_equal(out[1][0], flats[0] + flats[1])
    assert len(attempts) == 2  # once per worker, not once per step
    small = _integers(2, 1000, np.float32, seed=5)  # still fits: shared memory
    out, errors, _ = _together(rings, lambda r, ring: ring.all_reduce(small[r]))
    np.testing.assert_array_equal(out[0][0], small[0] + small[1])


def test_the_environment_variable_turns_it_off_and_is_checked(monkeypatch):
    monkeypatch.setenv(_shared_memory.ENVIRONMENT_VARIABLE, "0")
    rings = _linked_rings(2)
    assert all(r._link.outbox is None and r._link.inbox is None for r in rings)
    out, errors, _ = _together(
        rings, lambda r, ring: ring.all_reduce(np.full(5, r + 1.0))
    )
    np.testing.assert_array_equal(out[0][0], np.full(5, 3.0))
    monkeypatch.setenv(_shared_memory.ENVIRONMENT_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match="RING_SHARED_MEMORY='sometimes'"):
        _shared_memory.enabled()


# ----------------------------------------------- the ring's safety holds (issue 22)
def test_buffers_that_differ_are_an_error_on_both_workers():
    rings = _linked_rings(2, timeout=5.0)
    inputs = [np.ones(16, np.float32), np.ones(8, np.float64)]  # the same bytes
    _, errors, seconds = _together(rings, lambda r, ring: ring.all_reduce(inputs[r]))
    for error in errors:
        assert "differ between workers" in str(error), errors
        assert "float32[16]" in str(error) and "float64[8]" in str(error)
    assert seconds < 2.0


def test_a_dead_peer_is_an_error_and_the_ring_stays_failed():
    rings = _linked_rings(2, timeout=2.0)
    _together(rings, lambda r, ring: ring.all_reduce(np.ones(10)))  # in use
    rings[1]._fail(ConnectionError("killed by the test"))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="Socket all-reduce failed on worker 0"):
        rings[0].all_reduce(np.ones(1000, np.float32))
    assert time.monotonic() - start < 1.0
    with pytest.raises(RuntimeError, match="failed earlier on worker 0"):
        rings[0].all_reduce(np.ones(1000, np.float32))


def test_a_peer_that_does_not_call_is_a_timeout():
    rings = _linked_rings(2, timeout=0.5)
    with pytest.raises(RuntimeError, match="within the collective timeout"):
        rings[0].all_reduce(np.ones(1000, np.float32))
