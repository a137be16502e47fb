"""`_recompute.without_keeping_input`: the gradients of the plain op, in float64."""

import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.spatial import _recompute


def _assemble(tile, above, below):
    extended = tf.concat([above, tile, below], axis=1)
    return tf.pad(extended, [[0, 0], [0, 0], [1, 1], [0, 0]])


def _gradients(lean, run_eagerly):
    rng = np.random.default_rng(0)
    tile = tf.constant(rng.normal(size=(2, 6, 5, 3)))
    above = tf.constant(rng.normal(size=(2, 1, 5, 3)))
    below = tf.constant(rng.normal(size=(2, 1, 5, 3)))
    upstream = tf.constant(rng.normal(size=(2, 6, 5, 4)))
    kernel = tf.Variable(rng.normal(size=(3, 3, 3, 4)))

    def op(extended):  # reads a variable; then a pooling that reads none
        conv = tf.nn.conv2d(extended, kernel, 1, "VALID")
        return tf.nn.max_pool2d(tf.tanh(conv), 1, 1, "VALID")

    def step():
        with tf.GradientTape() as tape:
            tape.watch([tile, above, below])
            if lean:
                out = _recompute.without_keeping_input(
                    op, _assemble, tile, [above, below]
                )
            else:
                out = op(_assemble(tile, above, below))
            loss = tf.reduce_sum(out * upstream)
        return [out, *tape.gradient(loss, [tile, above, below, kernel])]

    values = step() if run_eagerly else tf.function(step)()
    return [v.numpy() for v in values]


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_outputs_and_gradients_equal_the_plain_op(run_eagerly):
    plain = _gradients(lean=False, run_eagerly=run_eagerly)
    lean = _gradients(lean=True, run_eagerly=run_eagerly)
    for a, b in zip(lean, plain):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    assert all(np.abs(g).max() > 0 for g in lean[1:])  # every gradient flows


def test_an_op_without_variables():
    x = tf.constant(np.arange(12.0).reshape(1, 4, 3, 1))
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = _recompute.without_keeping_input(
            lambda e: tf.nn.max_pool2d(e, 2, 1, "VALID"), lambda t: t * 2.0, x, []
        )
    np.testing.assert_array_equal(
        tape.gradient(out, x).numpy().ravel(),
        [0, 0, 0, 0, 2, 2, 0, 2, 2, 0, 2, 2],
    )
