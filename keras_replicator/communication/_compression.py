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

Not every platform sums every wire type (`check_wire_format`), and a wire type
is refused rather than silently replaced, because the two formats promise
different things (range versus precision):

* **GPUs**: the collectives run on NCCL, and TensorFlow's NCCL wrapper sums
  half / float / double / int32 / int64 only (`_platform.NCCL_DTYPES`), so a
  bfloat16 bucket fails at the first step. No other NCCL type has bfloat16's
  range (float32 does, at twice the bytes, i.e. no compression), so ``"bf16"``
  is refused where the platform is known: use ``"fp16"``, whose scaling keeps
  every sum in range.
* **TPUs**: bfloat16 is the chip's own 16-bit type; float16 is emulated, so
  ``"fp16"`` is refused: use ``"bf16"``.
* **CPUs**: both (TensorFlow's ring sums any float type), and so do GPUs that
  keep TensorFlow's RING (logical GPUs split from one, GPUs shared by workers:
  NCCL refuses two ranks on one GPU, `_platform.nccl_usable`).
"""

from __future__ import annotations

import tensorflow as tf

from keras_replicator import _platform

WIRE_DTYPES = {"fp16": tf.float16, "bf16": tf.bfloat16}
# What to use instead of a wire format a platform cannot sum, and why.
_REFUSED = {
    ("bf16", _platform.GPU): (
        "GPU collectives run on NCCL, whose TensorFlow wrapper sums float16, "
        "float32, float64, int32 and int64 only, not bfloat16",
        "Use compression='fp16' (16 bits, scaled so that no sum overflows) or "
        "compression=None",
    ),
    ("fp16", _platform.TPU): (
        "float16 is not a TPU type (the chip computes in bfloat16 and float32)",
        "Use compression='bf16' (the TPU's own 16-bit type, float32's range) or "
        "compression=None",
    ),
}
_FP16_TARGET = 2.0**15  # below float16's max (65504), a power of two


def check_wire_format(compression, platform: str, *, nccl: bool | None = None) -> None:
    """Refuses a wire format that `platform`'s collectives cannot sum.

    Call it where the platform is known: a strategy's constructor, or the
    first trace of the all-reduce on a stock strategy.

    Args:
        compression: `AllReduceOptions.compression`: `None`, `"fp16"` or
            `"bf16"`.
        platform: `"CPU"`, `"GPU"` or `"TPU"` (`_platform.platform_of`).
        nccl: Whether the GPU collectives run NCCL (`_platform.nccl_usable`);
            GPUs that keep TensorFlow's RING (logical or shared GPUs) sum
            bfloat16. Defaults to `None`: NCCL on GPUs.

    Raises:
        ValueError: `"bf16"` on GPUs, `"fp16"` on TPUs, naming the replacement.

    Example:
    >>> check_wire_format("fp16", "GPU")
    >>> check_wire_format("bf16", "GPU")
    Traceback (most recent call last):
    ...
    ValueError: `compression='bf16'` cannot travel on GPU replicas: GPU ...
    """
    if platform == _platform.GPU and nccl is False:
        return  # TensorFlow's RING sums any float type, as on CPUs
    refused = _REFUSED.get((compression, platform))
    if refused is None:
        return
    why, remedy = refused
    raise ValueError(
        f"`compression={compression!r}` cannot travel on {platform} replicas: "
        f"{why}. Received: compression={compression!r} on {platform}. {remedy}."
    )


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
