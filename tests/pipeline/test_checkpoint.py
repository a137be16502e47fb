import tensorflow as tf

from keras_replicator.pipeline._checkpoint import checkpointed


def test_gradients_equal_the_plain_gradients():
    w = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    x = tf.constant([[0.5, -1.0]])

    def run(x, weights):
        return tf.tanh(x @ weights[0]) ** 2, ()

    with tf.GradientTape() as tape:
        y, _ = checkpointed(run, x, [w.read_value()], "/cpu:0")
    with tf.GradientTape() as plain_tape:
        y_plain, _ = run(x, [w.read_value()])
    tf.debugging.assert_near(y, y_plain)
    tf.debugging.assert_near(tape.gradient(y, w), plain_tape.gradient(y_plain, w))


def test_recomputation_waits_for_the_incoming_gradient():
    @tf.function
    def graph():
        w = tf.constant(2.0)
        with tf.GradientTape() as tape:
            tape.watch(w)
            y, _ = checkpointed(lambda x, ws: (tf.sin(x * ws[0]), ()), 3.0 * w, [w], "")
        return tape.gradient(y, w)

    ops = graph.get_concrete_function().graph.get_operations()
    waiting = [op for op in ops if op.type == "Identity" and op.control_inputs]
    assert waiting, "the recomputation must have a control dependency"
