"""The compiled multi-step loop shared by Keras `fit` and `run_steps`.

`strategy.run` must not sit inside a `tf.cond` under MirroredStrategy (the stock
Keras `steps_per_execution` loop fails that way), so the loop carries the next
element's optional as a loop variable and asks it for a value in the loop condition.
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator.communication import _socket_transport


@tf.autograph.experimental.do_not_convert
def run_loop(one_step, iterator, num_steps: int):
    """Runs `one_step(element)` on up to `num_steps` elements; returns the last outputs.

    The first element is taken with `get_next()` (raising `OutOfRangeError` when the
    data is exhausted); later ones with `get_next_as_optional()`, stopping early at
    the end of the data.
    """
    outputs = one_step(iterator.get_next())
    if num_steps == 1:
        return outputs

    def cond(i, outputs, next_element):
        return tf.logical_and(i < num_steps, next_element.has_value())

    def body(i, outputs, next_element):
        outputs = one_step(next_element.get_value())
        # The next step's data waits for this step (its outputs and last ring
        # call): a while loop runs iterations as their inputs are ready, so the
        # next step's all-reduce could overtake this one's last ring call, and
        # the socket ring pairs calls by their order.
        with tf.control_dependencies(_after(outputs)):
            next_element = tf.cond(
                i + 1 < num_steps,
                iterator.get_next_as_optional,
                lambda: next_element,
            )
        return i + 1, outputs, next_element

    with tf.control_dependencies(_after(outputs)):
        first = iterator.get_next_as_optional()
    _, outputs, _ = tf.while_loop(cond, body, (tf.constant(1), outputs, first))
    return outputs


def _after(outputs) -> list:
    """What the next step's data waits for: with the socket ring, this step's
    outputs and last ring call (the logs' mean, which waits for the others);
    nothing otherwise (TensorFlow's collectives pair by key, not by order)."""
    last = _socket_transport.last_ring_call()
    if last is None:
        return []
    return [v for v in tf.nest.flatten(outputs) if tf.is_tensor(v)] + [last]
