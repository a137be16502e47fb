"""Division by the summed count: TensorFlow's op and the ring's numpy, bit for bit."""

import warnings

import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.communication import _division
from tests.communication.test_shared_memory import _linked_rings
from tests.communication.test_socket_ring import _rings, _together

TOTALS = [1.0, 3.0, 7.0, 257.0, 300.0, 1_000_003.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("total", TOTALS)
def test_numpy_in_place_rounds_as_the_tensorflow_op(dtype, total):
    values = np.random.default_rng(int(total)).normal(size=10_000).astype(dtype)
    expected = _division.divide(tf.constant(values), tf.constant(total, tf.float32))
    mine = values.copy()
    _division.divide_in_place([mine], np.float32(total))
    np.testing.assert_array_equal(mine.view(np.uint8), expected.numpy().view(np.uint8))


def test_float64_is_divided_not_multiplied():
    value = -1.2459109472530652  # times the float64 1/3 it is off by an ulp
    assert value * (1 / 3.0) != value / 3.0
    values = np.array([value], np.float64)
    _division.divide_in_place([values], np.float32(3.0))
    assert values[0] == value / 3.0


def test_16_bit_buffers_are_not_divided_in_numpy():
    with pytest.raises(ValueError, match="Received: dtype=float16"):
        _division.divide_in_place([np.ones(3, np.float16)], 2.0)


def test_a_count_of_zero_gives_tensorflows_inf_and_nan_without_warnings():
    values = np.array([1.0, 0.0, -1.0], np.float32)
    expected = _division.divide(tf.constant(values), tf.constant(0.0)).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _division.divide_in_place([values], np.float32(0.0))
    np.testing.assert_array_equal(values, expected)


def test_dividing_by_exact_needs_an_exact_value():
    from keras_replicator.communication import _all_reduce

    with pytest.raises(ValueError, match=r"Received: exact=\(\)"):
        _all_reduce.all_reduce_sum([tf.ones(3)], divide_by_exact=True)


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("shared_memory", [False, True], ids=["sockets", "shm"])
def test_the_ring_divides_each_chunk_as_tensorflow_divides_the_sum(size, shared_memory):
    if shared_memory and size == 1:
        pytest.skip("one worker has no link")
    shapes = [(3, 5), (), (7,), (11, 2)]  # chunk borders inside arrays
    inputs = [
        [
            np.random.default_rng(10 * r + i).normal(size=s).astype(np.float32)
            for i, s in enumerate(shapes)
        ]
        for r in range(size)
    ]
    rings = _linked_rings(size) if shared_memory else _rings(size)
    total = np.float32(257.0)
    out, errors, _ = _together(
        rings, lambda r, ring: ring.all_reduce(*inputs[r], divide_by=total)
    )
    assert not any(errors), errors
    for i in range(len(shapes)):
        summed = inputs[0][i].copy()
        for r in range(1, size):  # the ring's order of additions for 2 workers
            summed = summed + inputs[r][i]
        expected = _division.divide(tf.constant(summed), tf.constant(total)).numpy()
        for r in range(size):
            if size <= 2:  # 3 workers add in a chunk-dependent order
                np.testing.assert_array_equal(out[r][i], expected)
            np.testing.assert_allclose(out[r][i], expected, rtol=1e-6, atol=1e-7)
            np.testing.assert_array_equal(out[r][i], out[0][i])


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("shared_memory", [False, True], ids=["sockets", "shm"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_counts_ride_in_the_call_with_the_bits_of_a_call_of_their_own(
    size, shared_memory, dtype
):
    # Issue 36: the sample count used to be summed by a ring call of its own (a
    # whole ring protocol for 4 bytes) before the first bucket could divide.
    if shared_memory and size == 1:
        pytest.skip("one worker has no link")
    shapes = [(3, 5), (), (7,), (1,)]  # chunk borders inside arrays, tiny chunks
    inputs = [
        [
            np.random.default_rng(10 * r + i).normal(size=s).astype(dtype)
            for i, s in enumerate(shapes)
        ]
        for r in range(size)
    ]
    counts = [np.array([32.0 + r, 0.5 * r], np.float32) for r in range(size)]

    def separately(r, ring):  # as before: the counts alone, then the bucket
        (total,) = ring.all_reduce(counts[r])
        calls = ring.calls
        out = ring.all_reduce(*inputs[r], divide_by=total[0])
        return out, total, ring.calls - calls

    def together(r, ring):
        calls = ring.calls
        *out, total = ring.all_reduce(*inputs[r], counts=counts[r])
        return out, total, ring.calls - calls

    results = {}
    for name, work in (("separately", separately), ("together", together)):
        rings = _linked_rings(size) if shared_memory else _rings(size)
        results[name], errors, _ = _together(rings, work)
        assert not any(errors), errors
    for r in range(size):
        (old, old_total, _), (new, new_total, calls) = (
            results["separately"][r],
            results["together"][r],
        )
        assert calls == (1 if size > 1 else 0)
        np.testing.assert_array_equal(new_total, old_total)
        assert new_total.dtype == np.float32 and new_total.shape == (2,)
        for a, b in zip(new, old, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a.tobytes(), b.tobytes())
    expected_total = sum(c for c in counts)
    np.testing.assert_array_equal(results["together"][0][1], expected_total)


def test_counts_and_divide_by_are_one_choice():
    (ring,) = _rings(1)
    with pytest.raises(ValueError, match="Received: divide_by=2.0, counts="):
        ring.all_reduce(np.ones(3, np.float32), divide_by=2.0, counts=[3.0])


def _tpu_flavoured_scope():
    """A strategy that builds the TPU step on CPU (`_platform.platform_of`)."""
    import keras_replicator as kr
    from keras_replicator import _platform
    from keras_replicator._replicator_state import replicator_state

    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    replicator_state(strategy).platform = _platform.TPU
    return strategy.scope()


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16])
def test_on_a_tpu_the_quotient_is_float32_with_no_float64_op(dtype):
    values = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    total = np.float32(300.0)
    with _tpu_flavoured_scope():
        divide = tf.function(_division.divide)
        graph = divide.get_concrete_function(
            tf.TensorSpec([1000], dtype), tf.TensorSpec([], tf.float32)
        ).graph
        mine = divide(tf.cast(values, dtype), tf.constant(total))
    doubles = [op.name for op in graph.get_operations() if "DT_DOUBLE" in str(op)]
    assert not doubles, doubles
    # One rounding to float32 (then to the gradient's dtype), not the reciprocal's.
    quotient = tf.cast(values, dtype).numpy().astype(np.float32) / total
    expected = tf.cast(tf.constant(quotient), dtype).numpy()
    assert mine.dtype == dtype
    np.testing.assert_array_equal(
        mine.numpy().view(np.uint8), np.asarray(expected).view(np.uint8)
    )
