"""The socket ring's two phases as calls of their own (issue 24), workers as threads.

`SocketRing.reduce_scatter` and `SocketRing.all_gather`, which weight-update
sharding runs around the optimizer: checked against NumPy, against `all_reduce`
(bits and bytes), and for the safety of `all_reduce`'s calls (header, failure).
"""

import doctest

import ml_dtypes
import numpy as np
import pytest

from keras_replicator.communication.ring import _frames, _handshake, _socket_ring
from tests.communication.test_socket_ring import _rings, _together

pytestmark = pytest.mark.timeout(60)

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]


def _inputs(size, length, dtype, seed=0):
    """Integer values: every sum is exact in every dtype, in any order."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-8, 8, size * length).astype(dtype) for _ in range(size)]


def _is_new_and_aligned(result, source):
    assert result.ctypes.data % 64 == 0
    assert not np.shares_memory(result, source)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_leaves_each_worker_its_chunk_of_the_sum(size, dtype):
    length = 5
    flats = _inputs(size, length, dtype, seed=size)
    results, errors, _ = _together(
        _rings(size), lambda r, ring: ring.reduce_scatter(flats[r])
    )
    assert not any(errors), errors
    total = sum(f.astype(np.float64) for f in flats)
    for r, result in enumerate(results):
        assert result.shape == (length,) and result.dtype == dtype
        expected = total[r * length : (r + 1) * length]
        np.testing.assert_array_equal(result.astype(np.float64), expected)
        _is_new_and_aligned(result, flats[r])


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_concatenates_the_chunks_in_rank_order(size, dtype):
    chunks = _inputs(size, 7, dtype, seed=10 + size)
    results, errors, _ = _together(
        _rings(size), lambda r, ring: ring.all_gather(chunks[r])
    )
    assert not any(errors), errors
    expected = np.concatenate(chunks)
    for r, result in enumerate(results):
        assert result.dtype == dtype
        np.testing.assert_array_equal(result.view(np.uint8), expected.view(np.uint8))
        _is_new_and_aligned(result, chunks[r])


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, ml_dtypes.bfloat16])
def test_the_two_phases_give_all_reduces_bits_for_all_reduces_bytes(size, dtype):
    # Random values: the sums round, so equal bits need the same order of adds.
    rng = np.random.default_rng(size)
    flats = [rng.standard_normal(size * 1001).astype(dtype) for _ in range(size)]
    rings = _rings(size)

    def sharded(r, ring):
        chunk = ring.reduce_scatter(flats[r])
        return ring.all_gather(chunk), ring.bytes_sent

    def reduced(r, ring):
        before = ring.bytes_sent
        (result,) = ring.all_reduce(flats[r])
        return result, ring.bytes_sent - before

    phases, errors, _ = _together(rings, sharded)
    assert not any(errors), errors
    whole, errors, _ = _together(rings, reduced)
    assert not any(errors), errors
    reference = sum(f.astype(np.float64) for f in flats)
    step_bytes = 1001 * np.dtype(dtype).itemsize
    for r in range(size):
        np.testing.assert_array_equal(
            phases[r][0].view(np.uint8), whole[r][0].view(np.uint8)
        )
        np.testing.assert_allclose(
            phases[r][0].astype(np.float64), reference, rtol=0.05, atol=0.05
        )  # a sum, not just equal garbage (bfloat16 keeps 8 bits)
        assert phases[r][1] == whole[r][1] == 2 * (size - 1) * step_bytes
    assert all(ring.bytes_sent == 4 * (size - 1) * step_bytes for ring in rings)


def test_one_worker_copies_and_sends_nothing():
    (ring,) = _rings(1)
    flat = np.arange(6.0)
    chunk = ring.reduce_scatter(flat)
    np.testing.assert_array_equal(chunk, flat)
    _is_new_and_aligned(chunk, flat)
    np.testing.assert_array_equal(ring.all_gather(chunk), flat)
    assert ring.bytes_sent == 0


@pytest.mark.parametrize(
    "first,second,names",
    [
        ("reduce_scatter", "all_reduce", ["in reduce_scatter", "in all_reduce"]),
        ("reduce_scatter", "all_gather", ["in reduce_scatter", "in all_gather"]),
        ("all_gather", "all_reduce", ["in all_gather", "in all_reduce"]),
    ],
)
def test_different_operations_fail_both_workers_naming_both(first, second, names):
    rings = _rings(2, timeout=5.0)
    flat = np.ones(8, np.float32)

    def call(operation, ring):
        if operation == "all_reduce":
            return ring.all_reduce(flat)
        return getattr(ring, operation)(flat)

    # Two calls that pair up first: the counter counts every kind.
    _, errors, _ = _together(
        rings, lambda r, ring: ring.all_gather(ring.reduce_scatter(flat))
    )
    assert not any(errors), errors
    _, errors, seconds = _together(
        rings, lambda r, ring: call([first, second][r], ring)
    )
    for r, error in enumerate(errors):
        assert isinstance(error, RuntimeError), errors
        message = str(error)
        operation = [first, second][r].replace("_", "-")
        assert f"Socket {operation} failed on worker {r}" in message
        assert "the operations differ between workers" in message
        assert "call 3" in message
        for name in names:
            assert name in message
    assert seconds < 2.0  # at once, not after the 5 s timeout


@pytest.mark.parametrize(
    "operation,mine,theirs,names",
    [
        (
            "reduce_scatter",
            np.ones(16, np.float32),
            np.ones(8, np.float64),
            ["float32[16]", "float64[8]"],
        ),
        ("reduce_scatter", np.ones(8), np.ones(10), ["[8]", "[10]"]),
        ("all_gather", np.ones(3), np.ones(4), ["[3]", "[4]"]),
    ],
)
def test_buffers_that_differ_fail_both_workers(operation, mine, theirs, names):
    inputs = [mine, theirs]
    _, errors, seconds = _together(
        _rings(2, timeout=5.0), lambda r, ring: getattr(ring, operation)(inputs[r])
    )
    for error in errors:
        assert isinstance(error, RuntimeError), errors
        assert "the buffers differ between workers" in str(error)
        for name in names:
            assert name in str(error)
    assert seconds < 2.0


def test_empty_buffers_still_compare_headers():
    rings = _rings(2, timeout=5.0)
    results, errors, _ = _together(
        rings, lambda r, ring: ring.all_gather(ring.reduce_scatter(np.ones(0)))
    )
    assert not any(errors), errors
    assert all(result.shape == (0,) for result in results)
    inputs = [np.ones(0), np.ones(2)]
    _, errors, _ = _together(rings, lambda r, ring: ring.reduce_scatter(inputs[r]))
    assert all("float64[0]" in str(e) and "float64[2]" in str(e) for e in errors)


def test_bad_shapes_are_an_early_error_that_leaves_the_ring_working():
    rings = _rings(3, timeout=5.0)
    with pytest.raises(
        ValueError,
        match=r"multiple of the ring's 3 workers.*"
        r"Received: flat\.size=10\. Pad it to 12 values",
    ):
        rings[0].reduce_scatter(np.ones(10))
    with pytest.raises(
        ValueError,
        match=r"`flat` must be a 1-D array\. Received: "
        r"flat\.shape=\(3, 2\)",
    ):
        rings[0].reduce_scatter(np.ones((3, 2)))
    with pytest.raises(
        ValueError,
        match=r"`chunk` must be a 1-D array\. Received: "
        r"chunk\.shape=\(\)",
    ):
        rings[0].all_gather(np.float32(1.0))
    assert rings[0].bytes_sent == 0
    results, errors, _ = _together(
        rings, lambda r, ring: ring.reduce_scatter(np.full(12, r + 1.0))
    )
    assert not any(errors), errors
    for result in results:
        np.testing.assert_array_equal(result, np.full(4, 6.0))


def test_a_failed_ring_refuses_the_phases_too():
    rings = _rings(2, timeout=0.5)
    flat = np.ones(1000, np.float32)
    _, errors, _ = _together(rings[:1], lambda r, ring: ring.reduce_scatter(flat))
    assert "Socket reduce-scatter failed on worker 0" in str(errors[0])
    assert "within the collective timeout" in str(errors[0])
    # Worker 1 now calls: its neighbour closed the ring, so it fails at once.
    _, errors, seconds = _together(rings, lambda r, ring: ring.all_gather(flat))
    assert all(isinstance(e, RuntimeError) for e in errors), errors
    assert "failed earlier on worker 0" in str(errors[0])
    assert "call 1 failed: it did not finish within" in str(errors[0])
    assert seconds < 0.5
    for call in (rings[1].reduce_scatter, rings[1].all_gather, rings[1].all_reduce):
        with pytest.raises(RuntimeError, match="failed earlier on worker 1"):
            call(flat)


def test_the_docstring_examples_run():
    for module in (_socket_ring, _frames, _handshake):
        assert doctest.testmod(module, raise_on_error=False).failed == 0
