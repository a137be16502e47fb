"""The TCP ring all-reduce, with its workers as threads over socket pairs."""

import socket
import threading
import time

import ml_dtypes
import numpy as np
import pytest

from keras_replicator.communication.ring._socket_ring import SocketRing


def _rings(size, timeout=10.0):
    edges = [socket.socketpair() for _ in range(size)]  # edge r: r -> r + 1
    for pair in edges:
        for s in pair:
            s.settimeout(timeout)
    return [
        SocketRing(r, size, edges[r][0], edges[(r - 1) % size][1]) for r in range(size)
    ]


def _run(rings, inputs):
    results, errors = [None] * len(rings), []

    def work(r):
        try:
            results[r] = rings[r].all_reduce(*inputs[r])
        except Exception as error:  # noqa: BLE001 - re-raised in the test
            errors.append(error)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(len(rings))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results, errors


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]
)
def test_sums_arrays_of_any_shapes_across_chunk_borders(size, dtype):
    rng = np.random.default_rng(size)
    shapes = [(3, 5), (), (7,), (1, 1, 2)]  # 25 values: chunks cross array borders
    inputs = [
        [rng.integers(-8, 8, s).astype(dtype) for s in shapes] for _ in range(size)
    ]
    results, errors = _run(_rings(size), inputs)
    assert not errors, errors
    for r in range(size):
        for i, shape in enumerate(shapes):
            expected = sum(inputs[k][i].astype(np.float64) for k in range(size))
            assert results[r][i].shape == shape
            assert results[r][i].dtype == dtype
            np.testing.assert_array_equal(results[r][i].astype(np.float64), expected)
    for r in range(1, size):  # every worker holds the same bits
        for a, b in zip(results[0], results[r]):
            np.testing.assert_array_equal(
                a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
            )


def test_a_dead_peer_is_an_error():
    rings = _rings(2, timeout=2.0)
    rings[1]._send.close()
    rings[1]._receive.close()
    _, errors = _run(rings[:1], [[np.ones(1000, np.float32)]])
    assert errors and "Socket all-reduce failed on worker 0" in str(errors[0])


def test_a_ring_that_cannot_open_names_the_workers_and_the_way_out():
    from keras_replicator.communication.ring import _setup

    with pytest.raises(RuntimeError, match=r"worker\(s\) \[1\]\. Here: refused"):
        _setup.give_up(True, [1], "refused")
    with pytest.warns(UserWarning, match="Using TensorFlow's collectives instead"):
        assert _setup.give_up(False, [0, 1], None) is None


# ----------------------------------------------------------------- faults (issue 22)
def _together(rings, work, limit=10.0):
    """Runs `work(r, ring)` on every ring at once; (results, errors, seconds)."""
    results, errors = [None] * len(rings), [None] * len(rings)

    def run(r):
        try:
            results[r] = work(r, rings[r])
        except Exception as error:  # noqa: BLE001 - checked by the test
            errors[r] = error

    threads = [
        threading.Thread(target=run, args=(r,), daemon=True) for r in range(len(rings))
    ]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(limit)
    assert not any(t.is_alive() for t in threads), "a ring call hung"
    return results, errors, time.monotonic() - start


def _run_timed(rings, inputs, limit=10.0):
    """`_run` that also returns each worker's error (or None) and the wall time."""
    _, errors, seconds = _together(
        rings, lambda r, ring: ring.all_reduce(*inputs[r]), limit
    )
    return errors, seconds


@pytest.mark.parametrize(
    "mine,theirs,names",
    [
        (np.ones(10, np.float32), np.ones(12, np.float32), ["[10]", "[12]"]),
        (  # the same 64 bytes: only the header tells them apart
            np.ones(16, np.float32),
            np.ones(8, np.float64),
            ["float32[16]", "float64[8]"],
        ),
        (np.ones(0, np.float32), np.ones(4, np.float32), ["[0]", "[4]"]),
    ],
    ids=["10_vs_12", "float32x16_vs_float64x8", "empty_vs_4"],
)
def test_buffers_that_differ_are_an_error_on_both_workers(mine, theirs, names):
    outcomes, seconds = _run_timed(_rings(2, timeout=5.0), [[mine], [theirs]])
    for error in outcomes:
        assert isinstance(error, RuntimeError), outcomes
        assert "differ between workers" in str(error)
        for name in names:
            assert name in str(error)
    assert seconds < 2.0  # at once, not after the 5 s timeout


def test_a_mismatch_fails_every_worker_of_a_larger_ring():
    inputs = [[np.ones(10, np.float32)], [np.ones(10, np.float32)], [np.ones(12)]]
    outcomes, seconds = _run_timed(_rings(3, timeout=5.0), inputs)
    assert all(isinstance(e, RuntimeError) for e in outcomes), outcomes
    assert sum("differ between workers" in str(e) for e in outcomes) >= 1
    assert seconds < 2.0


def test_a_failed_ring_stays_failed():
    rings = _rings(2, timeout=0.5)
    data = [[np.full(1000, 1.0, np.float32)], [np.full(1000, 2.0, np.float32)]]
    outcomes, _ = _run_timed(rings[:1], data[:1])  # worker 1 misses call 1
    assert "within the collective timeout" in str(outcomes[0])
    # Both workers call again: worker 0's call 1 must not pair with worker 1's.
    outcomes, seconds = _run_timed(rings, data)
    assert all(isinstance(e, RuntimeError) for e in outcomes), outcomes
    assert "failed earlier on worker 0" in str(outcomes[0])
    assert "call 1 failed: it did not finish within" in str(outcomes[0])
    assert seconds < 0.5  # at once: the failed ring's peer sees its connection end
    for _ in range(2):  # and so on, for every later call
        with pytest.raises(RuntimeError, match="failed earlier on worker 1"):
            rings[1].all_reduce(*data[1])


def _trickle(source, target, stop, chunk=8, pause=0.02):
    """Forwards bytes from `source` to `target` at ~400 B/s until `stop` is set."""
    source.settimeout(0.1)
    while not stop.is_set():
        try:
            data = source.recv(chunk)
        except TimeoutError:
            continue
        except OSError:
            return
        if not data:
            return
        try:
            target.sendall(data)
        except OSError:
            return
        time.sleep(pause)


def test_a_peer_that_trickles_bytes_cannot_outlive_the_deadline():
    # Worker 1's bytes reach worker 0 a few at a time: every receive makes
    # progress well within the timeout, the whole call does not.
    zero_to_one, one_to_proxy, proxy_to_zero = (socket.socketpair() for _ in range(3))
    stop = threading.Event()
    proxy = threading.Thread(
        target=_trickle, args=(one_to_proxy[1], proxy_to_zero[0], stop), daemon=True
    )
    proxy.start()
    for s, timeout in [(zero_to_one[0], 1.0), (proxy_to_zero[1], 1.0)]:
        s.settimeout(timeout)  # worker 0: the collective timeout is 1 s
    for s in (one_to_proxy[0], zero_to_one[1]):
        s.settimeout(30.0)
    rings = [
        SocketRing(0, 2, zero_to_one[0], proxy_to_zero[1]),
        SocketRing(1, 2, one_to_proxy[0], zero_to_one[1]),
    ]
    data = [[np.ones(2000, np.float32)], [np.ones(2000, np.float32)]]
    try:
        outcomes, seconds = _run_timed(rings, data, limit=4.0)
    finally:
        stop.set()
    assert "within the collective timeout (1.0 s)" in str(outcomes[0])
    assert isinstance(outcomes[1], RuntimeError)  # its neighbour closed the ring
    assert seconds < 2.0


def test_out_buffers_receive_the_results_and_bad_ones_are_clear_errors():
    rings = _rings(2)
    grads = [np.arange(6.0), np.full(6, 10.0)]
    outs = [[np.empty(6), np.empty(3), np.empty(6)] for _ in rings]

    def work(r, ring):
        summed = ring.all_reduce(grads[r], out=[outs[r][0]])[0]
        chunk = ring.reduce_scatter(grads[r], out=outs[r][1])
        return summed, chunk, ring.all_gather(chunk, out=outs[r][2])

    out, errors, _ = _together(rings, work)
    assert errors == [None, None]
    for r, (summed, chunk, gathered) in enumerate(out):
        assert np.shares_memory(summed, outs[r][0]) and chunk is outs[r][1]
        assert gathered is outs[r][2]
        np.testing.assert_array_equal(summed, grads[0] + grads[1])
        np.testing.assert_array_equal(gathered, grads[0] + grads[1])
    with pytest.raises(ValueError, match="contiguous 1-D array of 3 float64"):
        rings[0].reduce_scatter(grads[0], out=np.empty(3, np.float32))
    with pytest.raises(ValueError, match="one array per input"):
        rings[0].all_reduce(grads[0], out=[])
    with pytest.raises(ValueError, match="must not overlap the inputs"):
        rings[0].all_reduce(grads[0], out=[grads[0]])
