"""The number of samples the current replica is training on, for exact averaging.

Keras on stock tf.distribute divides every replica's mean loss by the replica count and
sums the gradients, which equals the one-device gradient only when every replica holds
the same number of samples. The last batch of an epoch is usually uneven, so the
weights drift (1.5e-3 after one epoch of 1001 samples on 4 replicas).

Our strategies instead leave each replica's loss as the mean over its own samples and
average the gradients weighted by each replica's sample count:
``g = sum_r(n_r * g_r) / sum_r(n_r)``, which is exactly the gradient of the mean loss
over the global batch. The count travels from the step wrapper (which sees the batch)
to the gradient all-reduce (which sees only gradients) through this thread-local
stack: MirroredStrategy traces each replica in its own thread, so a thread-local value
set at the start of a replica's step is the one its optimizer reads.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import tensorflow as tf
from keras import tree

_local = threading.local()


@contextlib.contextmanager
def counting_samples(count: tf.Tensor) -> Iterator[None]:
    """Declares that the enclosed replica computation trains on `count` samples."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(count)
    try:
        yield
    finally:
        stack.pop()


def current_sample_count() -> tf.Tensor | None:
    """The innermost declared sample count of this replica, or None if unknown."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def batch_size_of(x) -> tf.Tensor:
    """Leading dimension of the first non-None leaf of `x`, as a float32 scalar."""
    for leaf in tree.flatten(x):
        if leaf is None:
            continue
        if isinstance(leaf, tf.RaggedTensor):
            return tf.cast(leaf.nrows(), tf.float32)
        if isinstance(leaf, tf.SparseTensor):
            return tf.cast(leaf.dense_shape[0], tf.float32)
        leaf = tf.convert_to_tensor(leaf)
        if leaf.shape.rank == 0:
            continue
        return tf.cast(tf.shape(leaf)[0], tf.float32)
    return tf.constant(1.0)
