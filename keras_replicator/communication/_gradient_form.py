"""The form a gradient is reduced in: its variable's shape, embeddings made exact.

**Static shapes.** TensorFlow cannot always infer a gradient's static shape: a
`Dense` layer on a 3-D input (a Transformer's feed-forward block) differentiates
through a reshape by the batch size, so its kernel's gradient is `(None, 8)` when
the batch size is unknown at trace time (a worker's dataset, an uneven last batch).
Buckets and the socket ring need sizes when the step is traced; a gradient's shape
is its variable's, so it is given that shape (`shaped_like`; a reshape to a static
shape costs nothing).

**Embedding gradients** (`tf.IndexedSlices`: one row per token *occurrence*, rows
repeating when a token repeats). Keras 3's optimizers apply element-wise
functions to such a gradient row by row: Adam's `ops.square(gradient)` squares each
occurrence, so a token seen twice adds `g1^2 + g2^2` to the second moment instead of
`(g1 + g2)^2`. The model then depends on how the batch is cut (one device, two
replicas, a sharded update: all different, in float64 too), where our promise is one
device's numbers: the gradient of the global batch. So under our strategies an
embedding gradient reaches the optimizer with each row once, the dense gradient's
rows, however many replicas there are (one included):

* a table of at most `DENSE_MAX_BYTES` is made dense with its variable's shape
  (`shaped_like`): it then travels in the buckets like any weight, over the socket
  ring where that is the transport, exactly (the dense sum of a step's rows);
* a larger table stays sparse: TensorFlow's sparse all-reduce all-gathers the
  touched rows of every replica (less traffic than the table), and the repeated
  rows are summed afterwards (`sum_repeated_rows`).

SGD is unchanged by either (a repeated row's updates add up the same way); Adam,
RMSprop, Adagrad, Adadelta, Adamax, Nadam, Lion, Ftrl get the dense gradient's update.

**On a TPU** (`_platform.platform_of` the current strategy) the step is one XLA
program: no dynamic shapes, so no `tf.unique` (its output's length depends on the
data). Every embedding gradient is made dense, whatever the table's size (as
TensorFlow's own TPU all-reduce does with `IndexedSlices`), and
`sum_repeated_rows` sums into the table's rows with a static-shape segment sum.
A large table then costs its full size in traffic and memory each step.
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator import _platform

# A table up to this size travels dense (16 MB: a 32k x 128 float32 embedding).
DENSE_MAX_BYTES = 16e6


def shaped_like(gradient, variable):
    """`gradient` in the form it is reduced in, as the module docstring says.

    A dense gradient gets its variable's static shape if its own is not fully
    known; an `IndexedSlices` becomes dense if the table holds at most
    `DENSE_MAX_BYTES` or the replicas are a TPU's, else keeps its rows.

    Args:
        gradient: A dense tensor or a `tf.IndexedSlices` (not `None`).
        variable: The variable it is the gradient of.

    Returns:
        A dense tensor of the variable's shape, or a `tf.IndexedSlices`.
    """
    if isinstance(gradient, tf.IndexedSlices) and not _on_tpu():
        size = tf.TensorShape(variable.shape).num_elements()
        if size is None or size * gradient.dtype.size > DENSE_MAX_BYTES:
            return gradient
    return dense_like(gradient, variable)


def _on_tpu() -> bool:
    return _platform.platform_of(tf.distribute.get_strategy()) == _platform.TPU


def dense_like(gradient, variable):
    """`gradient` made dense, whatever its size, with its variable's static shape."""
    if isinstance(gradient, tf.IndexedSlices):
        gradient = tf.convert_to_tensor(gradient)
    shape = tf.TensorShape(variable.shape)
    if gradient.shape.is_fully_defined() or not shape.is_fully_defined():
        return gradient
    return tf.reshape(gradient, shape)


def sum_repeated_rows(slices: tf.IndexedSlices) -> tf.IndexedSlices:
    """The same gradient with each index once: repeated rows summed.

    Example:
    >>> slices = tf.IndexedSlices(tf.constant([[1.0], [2.0], [4.0]]),
    ...                           tf.constant([3, 0, 3]), tf.constant([5, 1]))
    >>> summed = sum_repeated_rows(slices)
    >>> summed.indices.numpy().tolist(), summed.values.numpy().ravel().tolist()
    ([3, 0], [5.0, 2.0])

    On a TPU the result has every row of the table, in order (static shapes,
    no `tf.unique`); rows no index touched are zero.
    """
    if _on_tpu():
        if slices.dense_shape is None:
            raise ValueError(
                "On a TPU an embedding gradient is summed into its table's rows, "
                "so its `dense_shape` must be known. Received: dense_shape=None. "
                "Build the `tf.IndexedSlices` with the table's shape."
            )
        # A count XLA can fold into a constant (the table's rows are static).
        static = tf.get_static_value(slices.dense_shape)
        rows = int(static[0]) if static is not None else slices.dense_shape[0]
        values = tf.math.unsorted_segment_sum(slices.values, slices.indices, rows)
        indices = tf.range(tf.shape(values)[0], dtype=slices.indices.dtype)
        return tf.IndexedSlices(values, indices, slices.dense_shape)
    indices, positions = tf.unique(slices.indices)
    values = tf.math.unsorted_segment_sum(
        slices.values, positions, tf.shape(indices)[0]
    )
    return tf.IndexedSlices(values, indices, slices.dense_shape)
