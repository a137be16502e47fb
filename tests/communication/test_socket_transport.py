"""`ring_call`: the socket ring reads and returns tensors without copies.

Checked by pointer, not by timing (issue 36): the numpy array a ring method
receives must start at the address of the tensor given to `ring_call`, and the
tensor `ring_call` returns must start at the address of the array the ring made.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.communication._socket_transport import ring_call
from keras_replicator.communication.ring import _frames

_SIZE = 1 << 14  # 128 KB of float64


def _address(array) -> int:
    return np.asarray(array).__array_interface__["data"][0]


def _buffer_of(tensor) -> int:
    """Where an eager CPU tensor's bytes are (a memoryview aliases them)."""
    return _address(memoryview(tensor))


class _Recorder:
    """A stand-in ring method: notes where its inputs and outputs are."""

    def __init__(self):
        self.inputs, self.outputs = [], []

    def __call__(self, extra, *arrays):
        self.extra = float(extra)
        self.inputs = [_address(a) for a in arrays]
        results = []
        for a in arrays:
            result = _frames.aligned_empty(a.size, a.dtype).reshape(a.shape)
            result[...] = a
            results.append(result)
        self.outputs = [_address(r) for r in results]
        return results


def _values():
    variable = tf.Variable(np.arange(_SIZE, dtype=np.float64))
    constant = tf.constant(np.ones([_SIZE // 4, 4]))
    return variable, constant


def test_the_ring_reads_the_tensors_own_buffers_in_a_step():
    variable, constant = _values()
    divide_by = tf.constant(2.0, tf.float64)
    record = _Recorder()

    @tf.function
    def step(argument, total):
        values = [variable.read_value(), argument]
        shapes = [v.shape for v in values]
        return ring_call(record, values, shapes, "all_reduce", extra=[total])

    outputs = step(constant, divide_by)
    expected = [_buffer_of(variable.read_value()), _buffer_of(constant)]
    # Before issue 36 this was thought to be a copy (about 1.4 ms per 25 MB).
    assert record.inputs == expected, "ring_call copied an input"
    assert record.extra == 2.0
    assert [_buffer_of(o) for o in outputs] == record.outputs, (
        "ring_call copied the ring's output"
    )
    np.testing.assert_array_equal(outputs[0].numpy(), variable.numpy())
    assert outputs[1].shape == constant.shape
    assert outputs[1].dtype == tf.float64


def test_gradients_from_an_xla_forward_backward_reach_the_ring_uncopied():
    """Our `jit_compile` steps feed the ring the outputs of a compiled function."""
    variable, _ = _values()
    record, seen = _Recorder(), []

    @tf.function(jit_compile=True)
    def forward_backward(value):
        with tf.GradientTape() as tape:
            tape.watch(value)
            loss = tf.reduce_sum(value**2)
        return tape.gradient(loss, value)

    def witness(gradient):  # `tf.py_function` hands over the op's own tensor
        seen.append(_buffer_of(gradient))
        return gradient

    @tf.function
    def step():
        gradient = forward_backward(variable.value())
        (summed,) = ring_call(
            record, [gradient], [gradient.shape], "all_reduce", extra=[0.0]
        )
        with tf.control_dependencies([summed]):
            tf.py_function(witness, [gradient], tf.float64)
        return summed

    summed = step()
    np.testing.assert_array_equal(summed.numpy(), 2 * variable.numpy())
    assert record.inputs == seen, "ring_call copied the gradient"


@pytest.mark.parametrize("outputs", [1, 2])
def test_eager_calls_keep_shapes_dtypes_and_a_list(outputs):
    """`fit(run_eagerly=True)`: one output comes back as a list, too."""
    record = _Recorder()
    values = [tf.ones([3, 2], tf.float64)] * outputs
    results = ring_call(
        record, values, [v.shape for v in values], "all_reduce", extra=[1.0]
    )
    assert isinstance(results, list) and len(results) == outputs
    for result in results:
        assert result.shape == (3, 2) and result.dtype == tf.float64
