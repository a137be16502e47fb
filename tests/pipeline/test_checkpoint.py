import tensorflow as tf

from keras_replicator.pipeline._checkpoint import BackwardChain, checkpointed


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


def test_recomputations_of_one_stage_run_one_after_another():
    chain = BackwardChain()
    built = []

    @tf.function
    def graph():
        w = tf.constant(2.0)
        with tf.GradientTape() as tape:
            tape.watch(w)
            ys = [
                checkpointed(
                    lambda x, ws: (tf.sin(x * ws[0]), ()), x * w, [w], "", chain
                )[0]
                for x in (1.0, 2.0, 3.0)
            ]
            total = tf.add_n(ys)
        gradient = tape.gradient(total, w)
        built.append(list(chain.last))
        return gradient

    ops = graph.get_concrete_function().graph.get_operations()
    waiting = [op for op in ops if op.type == "Identity" and op.control_inputs]
    # Each recomputation waits for its incoming gradient; all but the first built
    # also wait for the previous recomputation's gradients (x and the weight).
    counts = sorted(len(op.control_inputs) for op in waiting)
    assert counts[0] == 1 and counts[-1] == 3, counts
    assert len(built[0]) == 2


def test_chained_recomputations_give_the_plain_gradients():
    w = tf.Variable(0.7)

    def run(x, weights):
        return tf.sin(x * weights[0]), ()

    @tf.function
    def gradient(chain):
        with tf.GradientTape() as tape:
            if chain is None:
                ys = [run(x * w, [w])[0] for x in (1.0, 2.0, 3.0)]
            else:
                ys = [
                    checkpointed(run, x * w, [w.read_value()], "", chain)[0]
                    for x in (1.0, 2.0, 3.0)
                ]
            total = tf.add_n(ys)
        return tape.gradient(total, w)

    tf.debugging.assert_near(gradient(BackwardChain()), gradient(None))
