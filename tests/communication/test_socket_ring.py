"""The TCP ring all-reduce, with its workers as threads over socket pairs."""

import socket
import threading

import ml_dtypes
import numpy as np
import pytest

from keras_replicator.communication._socket_ring import SocketRing


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
    from keras_replicator.communication import _socket_ring

    with pytest.raises(RuntimeError, match=r"worker\(s\) \[1\]\. Here: refused"):
        _socket_ring._give_up(True, [1], "refused")
    with pytest.warns(UserWarning, match="Using TensorFlow's collectives instead"):
        assert _socket_ring._give_up(False, [0, 1], None) is None
