"""The socket ring's payloads through shared memory (issues 23, 34), workers as threads.

Threads of one process hand each other their segments exactly as processes of one
machine do (memfd descriptors over Unix sockets); the multi-worker tests
(`test_shared_memory_multi_worker`) run the same code between real worker
processes, where it is the default.
"""

import doctest
import fcntl
import os
import pathlib
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings

import ml_dtypes
import numpy as np
import pytest

from keras_replicator.communication.ring import (
    _frames,
    _handover,
    _memfd,
    _passes,
    _shared_memory,
)
from keras_replicator.communication.ring._socket_ring import SocketRing
from tests.communication.test_socket_ring import _rings, _together

pytestmark = pytest.mark.timeout(60)


def _mapped():
    """This process's mappings: `memfd:` segments, and ring files in `/dev/shm`
    (the process may map others: a POSIX semaphore is `/dev/shm/sem.*`)."""
    with open("/proc/self/maps") as maps:
        lines = maps.read().splitlines()
    return (
        [line for line in lines if "memfd:krring" in line],
        [line for line in lines if "/dev/shm/krring" in line],
    )


def _open_segment_descriptors():
    """Descriptors of this process that another process could open via /proc."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if "krring" in os.readlink(f"/proc/self/fd/{name}"):
                found.append(name)
        except OSError:
            pass  # closed meanwhile (the listing's own descriptor)
    return found


def _linked_rings(size, timeout=10.0, refuse=(), before_connect=None):
    """Rings whose links were opened as `SocketRing.connect` opens them.

    `refuse`: ranks that cannot take their left neighbour's segment (as on
    another machine, where its listener's name does not exist): that link keeps
    socket payloads. `before_connect(name)`: runs before a worker connects to
    its right neighbour's listener.
    """
    edges = [socket.socketpair() for _ in range(size)]  # edge r: r -> r + 1
    for pair in edges:
        for s in pair:
            s.settimeout(timeout)
    links, errors = [None] * size, []
    original = _handover.connect
    unreachable = {f"open {(r - 1) % size}" for r in refuse}

    def open_link(r):
        try:
            links[r] = _shared_memory.open_link(
                edges[r][0], edges[(r - 1) % size][1], time.monotonic() + timeout
            )
        except Exception as error:  # noqa: BLE001 - checked below
            errors.append(error)

    def connect(name, pid, deadline):
        if threading.current_thread().name in unreachable:
            raise ConnectionRefusedError(111, "Connection refused")
        if before_connect is not None:
            before_connect(name)
        return original(name, pid, deadline)

    _handover.connect = connect
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
        _handover.connect = original
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


def test_segments_grow_have_no_name_and_leave_no_descriptor_open():
    # Issue 34: segments were files of /dev/shm, offered by name; a process of
    # the same user could open one before the neighbour unlinked it.
    shm = set(os.listdir("/dev/shm"))
    rings = _linked_rings(2)
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
    memfds, files = _mapped()
    assert len(memfds) >= 4 and not files  # anonymous memory, no file mapped
    assert not _open_segment_descriptors()  # nothing to open via /proc/<pid>/fd
    assert not [n for n in set(os.listdir("/dev/shm")) - shm if "krring" in n]
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
    # Worker 1 cannot take worker 0's segment (another machine): link 0 -> 1 uses
    # the socket, links 1 -> 2 and 2 -> 0 shared memory, in one ring.
    rings = _linked_rings(3, refuse=[1])
    assert rings[0]._link.outbox is None and rings[1]._link.inbox is None
    assert rings[1]._link.outbox is not None and rings[0]._link.inbox is not None
    flats = _integers(3, 3_000_001, np.float32, seed=3)
    out, errors, _ = _together(rings, lambda r, ring: ring.all_reduce(flats[r]))
    assert not any(errors), errors
    for result in out:
        np.testing.assert_array_equal(result[0], sum(flats))


def test_a_flooded_listener_is_said_and_the_link_keeps_socket_payloads():
    """Another local user filling worker 1's listener backlog (issue 49, item 6):
    worker 0's hand-over times out; the link falls back to TCP with a warning."""

    def flooded(name):
        if threading.current_thread().name == "open 0":
            raise TimeoutError("timed out")

    with pytest.warns(UserWarning, match="may have been flooded by another local"):
        rings = _linked_rings(2, before_connect=flooded)
    assert rings[0]._link.outbox is None and rings[1]._link.inbox is None
    flats = _integers(2, 1000, np.float32, seed=6)
    out, errors, _ = _together(rings, lambda r, ring: ring.all_reduce(flats[r]))
    assert not any(errors), errors
    np.testing.assert_array_equal(out[0][0], flats[0] + flats[1])


def test_a_segment_that_cannot_grow_sends_through_the_socket(monkeypatch):
    rings = _linked_rings(2)
    attempts = []

    def full(slot_bytes):
        attempts.append(slot_bytes)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_memfd.Segment, "create", staticmethod(full))
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


# ------------------------------------- what a neighbour or a stranger can do (issue 34)
@pytest.fixture
def victim():
    """A file of ours, its path short enough for the old note's 64 bytes."""
    directory = tempfile.mkdtemp(prefix="kr")
    path = pathlib.Path(directory) / "victim"
    path.write_bytes(b"keep me" * 10_000)
    yield path
    shutil.rmtree(directory)


def _old_note_naming(victim):
    # Before issue 34, a grown segment's note carried a name that the receiver
    # joined onto /dev/shm, opened read-write, mapped, added in and unlinked.
    return b"KRs1" + struct.pack("!QQ", 1, 4000) + str(victim).encode().ljust(64, b"\0")


def _descriptor_of(victim):
    return os.open(victim, os.O_RDWR)


def _small_memfd(_):
    descriptor = os.memfd_create("krring", os.MFD_ALLOW_SEALING)
    os.ftruncate(descriptor, 2 * 1000)
    fcntl.fcntl(descriptor, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return descriptor


@pytest.mark.parametrize(
    "sent, refusal",
    [
        (_old_note_naming, "(b'KRs1')"),
        (_descriptor_of, "not sealed against shrinking"),
        (_small_memfd, "is not a segment for steps of 4000 bytes"),
    ],
    ids=["a note naming a file", "a file's descriptor", "a memfd too small"],
)
def test_a_neighbour_cannot_make_a_worker_open_or_delete_a_file(victim, sent, refusal):
    rings = _linked_rings(2, timeout=5.0)
    outcome = {}

    def worker_1():
        try:
            outcome["sum"] = rings[1].all_reduce(np.ones(2000, np.float32))
        except RuntimeError as error:
            outcome["error"] = str(error)

    thread = threading.Thread(target=worker_1)
    thread.start()
    # Worker 0 misbehaves: a valid header, then its own idea of step 1.
    tcp, unix = rings[0]._send, rings[0]._link._sending
    tcp.sendall(_frames.header(1, np.float32, 2000))
    if sent is _old_note_naming:
        tcp.sendall(sent(victim))
    else:
        descriptor = sent(victim)
        frame = _handover._FRAME.pack(_handover._MAGIC, 1)
        socket.send_fds(unix, [frame], [descriptor])
        os.close(descriptor)
        tcp.sendall(_shared_memory._NOTE.pack(_shared_memory._GROWN, 1, 4000))
    thread.join(10)
    assert victim.read_bytes() == b"keep me" * 10_000  # there, and untouched
    assert "error" in outcome, outcome
    assert refusal in outcome["error"]
    assert "failed on worker 1" in outcome["error"]


def test_a_stranger_cannot_take_the_place_of_the_left_neighbour():
    # Anyone may connect to an abstract Unix name (they are listed in
    # /proc/net/unix): a worker takes a segment only from its left neighbour's
    # pid, as told over their proven TCP connection.
    strangers = []

    def stranger_first(name):
        if threading.current_thread().name != "open 0" or strangers:
            return
        code = (
            "import socket, sys; s = socket.socket(socket.AF_UNIX); "
            f"s.connect(bytes.fromhex('{name.hex()}')); print('connected', "
            "flush=True); s.recv(1); print('closed', flush=True)"
        )
        stranger = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
        )
        strangers.append(stranger)
        assert stranger.stdout.readline().strip() == "connected"

    rings = _linked_rings(2, before_connect=stranger_first)
    assert strangers, "the stranger did not run"
    stranger = strangers[0]
    assert stranger.wait(10) == 0 and stranger.stdout.read().strip() == "closed"
    assert all(ring._link.inbox and ring._link.outbox for ring in rings)
    flats = _integers(2, 3_000_000, np.float32, seed=6)
    out, errors, _ = _together(rings, lambda r, ring: ring.all_reduce(flats[r]))
    assert not any(errors), errors
    np.testing.assert_array_equal(out[1][0], flats[0] + flats[1])


KILLED = textwrap.dedent(
    """
    import os, signal, socket, threading, time
    from keras_replicator.communication.ring import _shared_memory
    (a, b), (c, d) = socket.socketpair(), socket.socketpair()
    # Worker 0 makes its segment and offers it; worker 1 never answers.
    link = threading.Thread(
        target=_shared_memory.open_link, args=(a, d, time.monotonic() + 30, 1 << 23)
    )
    link.daemon = True
    link.start()
    time.sleep(0.5)
    print(os.getpid(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_worker_killed_while_opening_leaves_nothing_behind():
    before = {n for n in os.listdir("/dev/shm") if "krring" in n}
    child = subprocess.run(
        [sys.executable, "-c", KILLED], capture_output=True, text=True, timeout=60
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    pid = child.stdout.strip()
    left = {n for n in os.listdir("/dev/shm") if "krring" in n} - before
    assert not [n for n in left if f"-{pid}-" in n], left


def test_no_shared_memory_where_the_platform_lacks_it(monkeypatch):
    monkeypatch.setattr(_memfd, "supported", lambda: False)
    rings = _linked_rings(2)
    assert all(r._link.outbox is None and r._link.inbox is None for r in rings)
    out, errors, _ = _together(rings, lambda r, ring: ring.all_reduce(np.ones(5)))
    assert not any(errors), errors
    np.testing.assert_array_equal(out[0][0], np.full(5, 2.0))


def test_the_docstring_examples_run():
    for module in (_shared_memory, _memfd, _handover):
        assert doctest.testmod(module, raise_on_error=False).failed == 0


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("divide", ["divide_by", "counts"])
def test_a_received_chunk_is_read_once_and_the_bits_do_not_change(
    size, dtype, divide, monkeypatch
):
    # Issue 36: a received chunk is added, divided and staged for the next step
    # block by block; before, the division and the copy into the outbox were
    # passes of their own. Tiny blocks, so blocks and chunk borders cross.
    monkeypatch.setattr(_passes, "BLOCK_BYTES", 24)
    shapes = [(3, 5), (), (7,), (1, 1, 2), (11,)]
    inputs = [
        [
            np.random.default_rng(10 * r + i).normal(size=s).astype(dtype)
            for i, s in enumerate(shapes)
        ]
        for r in range(size)
    ]
    counts = [np.array([3.0 + r], np.float32) for r in range(size)]

    def call(r, ring):
        if divide == "divide_by":
            return ring.all_reduce(*inputs[r], divide_by=np.float32(7.0))
        return ring.all_reduce(*inputs[r], counts=counts[r])

    rings = _linked_rings(size)
    for _ in range(2):  # the second call reuses slots the first call staged in
        fused, errors, _ = _together(rings, call)
        assert not any(errors), errors
    plain, errors, _ = _together(_rings(size), call)  # sockets: divided after
    assert not any(errors), errors
    for r in range(size):
        assert len(fused[r]) == len(plain[r])
        for a, b in zip(fused[r], plain[r]):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(
                a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
            )
    # Every step whose payload was just received: the reduce's n - 1 steps and
    # the all-gather's n - 2 forwarded chunks, in each of the 2 calls.
    assert [ring._link.staged_steps for ring in rings] == [2 * (2 * size - 3)] * size
    # And against NumPy (the ring adds in its own order: not bit for bit).
    divisor = 7.0 if divide == "divide_by" else sum(float(c[0]) for c in counts)
    for i in range(len(shapes)):
        expected = sum(inputs[r][i].astype(np.float64) for r in range(size)) / divisor
        np.testing.assert_allclose(fused[0][i], expected, rtol=1e-5)


def test_a_count_of_zero_divides_to_inf_and_nan_without_a_warning():
    rings = _linked_rings(2)
    values = [np.array([1.0, 0.0, -1.0], np.float32) for _ in range(2)]
    zero = np.array([0.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, errors, _ = _together(
            rings, lambda r, ring: ring.all_reduce(values[r], counts=zero)
        )
    assert not any(errors), errors
    summed, total = out[0]
    assert total[0] == 0.0
    assert np.isposinf(summed[0]) and np.isnan(summed[1]) and np.isneginf(summed[2])
