"""Wire compression: gradients cross the network in 16 bits and are summed there.

Halving the bytes halves the time on a bandwidth-bound link (Jia et al. 2018 send
fp16 gradients); the price is precision, and for float16 also range.

* ``"bf16"``: bfloat16 has float32's exponent range, so nothing can overflow; each
  value keeps 8 significant bits (relative error <= 2**-9 per rounding), and the
  partial sums of the reduction are rounded too.
* ``"fp16"``: float16 keeps 11 significant bits but overflows at 65504 and loses
  values below 6e-8. Before the cast the bucket is multiplied by a power of two
  ``s`` chosen from ``M = sum over replicas of max|g_r|`` (one extra float32 scalar
  all-reduce per bucket): every partial sum of the ring is bounded by ``M``, so
  ``s * M <= 2**15`` can never overflow, and the largest values use the top of
  float16's range. Values more than ~2**24 times smaller than the largest
  gradient of the bucket flush to zero. Powers of two make the scaling exact.

Decoding casts back to the gradient's own dtype and divides by ``s``.
"""

from __future__ import annotations

import tensorflow as tf

WIRE_DTYPES = {"fp16": tf.float16, "bf16": tf.bfloat16}
_FP16_TARGET = 2.0**15  # below float16's max (65504), a power of two


def compresses(compression, dtype) -> bool:
    """Whether a buffer of `dtype` travels compressed."""
    return compression is not None and dtype in (tf.float32, tf.float64)


def needs_scale(compression) -> bool:
    """Whether the encoding needs the replicas' summed max-abs first."""
    return compression == "fp16"


def local_max_abs(flat) -> tf.Tensor:
    """This replica's largest |value| of a bucket, as a float32 scalar."""
    return tf.cast(tf.reduce_max(tf.abs(flat)), tf.float32)


def scale_for(summed_max_abs) -> tf.Tensor:
    """The power-of-two fp16 scale for a bucket whose replicas' max-abs sum is given.

    Non-finite or zero inputs give a scale of 1, so infinities and NaNs reach the
    optimizer (and a `LossScaleOptimizer` skips the step) instead of being hidden.
    """
    m = tf.cast(summed_max_abs, tf.float32)
    usable = tf.logical_and(tf.math.is_finite(m), m > 0)
    safe = tf.where(usable, m, 1.0)
    exponent = tf.floor(tf.math.log(_FP16_TARGET / safe) / tf.math.log(2.0))
    exponent = tf.clip_by_value(exponent, -126.0, 126.0)
    return tf.where(usable, tf.pow(2.0, exponent), 1.0)


def encode(flat, compression, scale=None) -> tf.Tensor:
    """Casts a flat float buffer to the wire dtype (scaled first for fp16)."""
    if scale is not None:
        flat = flat * tf.cast(scale, flat.dtype)
    return tf.cast(flat, WIRE_DTYPES[compression])


def decode(wire, dtype, scale=None) -> tf.Tensor:
    """Casts a reduced wire buffer back to `dtype` and undoes the scale."""
    flat = tf.cast(wire, dtype)
    if scale is not None:
        flat = flat / tf.cast(scale, dtype)
    return flat
