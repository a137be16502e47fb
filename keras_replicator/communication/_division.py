"""Division by the summed sample count: in TensorFlow, and fused into the socket ring.

The sample-weighted gradient mean ends in ``sum_r(n_r * g_r) / sum_r(n_r)``
(`_reduction`). A division costs about twice a multiplication
here (1.8 vs 0.9 ms a step for the 6.3M-parameter MLP), so below float64 it is a
product with the reciprocal, taken in float64 and rounded once to the gradient's
dtype: at most one rounding more (float32: 6e-8 relative). float64 gradients are
divided: a float32 reciprocal of the count (1/300 is inexact) would cap float64
models at float32 accuracy.

On the socket ring (issue 23) the division runs inside the all-reduce, between
its two phases: each worker divides only the chunk it has just summed, 1/N of
the buffer while it is still in cache, and the all-gather spreads the quotients.
That is one pass over 1/N of the gradients instead of a TensorFlow op over all of
them (2.9 ms of a 75 ms 2-worker MLP step). `divide_in_place` rounds exactly as
`divide` does, so the fused path changes no bit (`tests/communication/
test_division.py`).

On a TPU (`_platform.platform_of` the current strategy) the step is one XLA
program and the chip has no float64 (issue 48): a gradient below float64 is
divided in float32 (16-bit ones are cast up and back), one correctly rounded
quotient instead of the float64 reciprocal's product. That is at least as accurate (one
rounding, not two) but not the same bits: a float32 gradient may differ from the
CPU / GPU path's in the last place (6e-8 relative), so a TPU run matches a GPU
run to float32 precision, not bit for bit. XLA may itself lower the division to
a reciprocal and a Newton step on the chip.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_replicator import _platform

# The dtypes the ring divides itself; others are divided by `divide` afterwards.
FUSED_DTYPES = (tf.float32, tf.float64)


def divide(grad, total):
    """`grad / total` (a tensor or `tf.IndexedSlices`), as described above.

    The platform is the current strategy's: on a TPU no float64 op is made
    for a gradient below float64.

    Example:
    >>> float(divide(tf.constant(3.0), tf.constant(4.0)))
    0.75
    """
    values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
    if values.dtype == tf.float64:
        values = values / tf.cast(total, tf.float64)
    elif _platform.platform_of(tf.distribute.get_strategy()) == _platform.TPU:
        quotient = tf.cast(values, tf.float32) / tf.cast(total, tf.float32)
        values = tf.cast(quotient, values.dtype)
    else:
        inverse = 1.0 / tf.cast(total, tf.float64)
        values = values * tf.cast(inverse, values.dtype)
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return values


def divide_in_place(arrays, total) -> None:
    """Divides float32 / float64 numpy `arrays` by `total` with `divide`'s bits.

    Example:
    >>> a = np.array([3.0, 1.0], np.float32)
    >>> divide_in_place([a], np.float32(4.0)); a
    array([0.75, 0.25], dtype=float32)
    """
    for array in arrays:
        divider(total, array.dtype)(array)


def divider(total, dtype):
    """A function dividing a numpy array of `dtype` by `total` in place, as
    `divide_in_place` does (the socket ring applies it block by block).

    Example:
    >>> a = np.array([3.0, 1.0])
    >>> divider(np.float32(2.0), a.dtype)(a); a
    array([1.5, 0.5])
    """
    total = np.float64(np.asarray(total).reshape(-1)[0])
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(
            "The ring divides float32 / float64 buffers only (others round "
            f"differently in numpy). Received: dtype={dtype}. Divide it "
            "with `divide` after the sum."
        )
    # A count of 0 (every replica had an empty batch) gives inf / nan, as
    # TensorFlow's op does, without numpy's warnings.
    if dtype == np.float64:

        def apply(array):
            with np.errstate(divide="ignore", invalid="ignore"):
                np.divide(array, total, out=array)

        return apply
    with np.errstate(divide="ignore"):
        factor = dtype.type(1.0 / total)

    def apply(array):
        with np.errstate(invalid="ignore"):
            np.multiply(array, factor, out=array)

    return apply
