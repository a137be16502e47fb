"""Runs one workload on a strategy and on one device, and compares the results.

The transparency principle: N replicas at global batch B must give what one device
gives at batch B. Each conformance check is a model builder plus a workload; this
module runs both sides from the same initial weights and reports the largest
difference against a stated tolerance.

Both sides run with TensorFloat-32 off (`exact_float32`): on Ampere and newer GPUs
TensorFlow runs float32 matmuls and convolutions in TF32 by default, with a 10-bit
mantissa, and the two sides' rounding would differ by far more than the float32
tolerances the checks state.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """Outcome of one check on one strategy."""

    check: str
    passed: bool
    detail: str
    max_error: float | None = None
    tolerance: float | None = None
    available: bool = True

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class CheckFailure(AssertionError):
    """A check's comparison failed; the message says what differed and by how much."""


def max_difference(reference, candidate) -> float:
    """Largest absolute elementwise difference between two nested results."""
    import keras

    ref_leaves = keras.tree.flatten(reference)
    got_leaves = keras.tree.flatten(candidate)
    if len(ref_leaves) != len(got_leaves):
        raise CheckFailure(
            "results differ in structure: "
            f"{len(ref_leaves)} vs {len(got_leaves)} leaves"
        )
    worst = 0.0
    for ref, got in zip(ref_leaves, got_leaves):
        ref = np.asarray(ref)
        got = np.asarray(got)
        if ref.shape != got.shape:
            raise CheckFailure(f"shapes differ: {ref.shape} vs {got.shape}")
        if ref.dtype.kind in "fc":
            worst = max(worst, float(np.max(np.abs(ref - got), initial=0.0)))
        elif not np.array_equal(ref, got):
            raise CheckFailure("non-float results differ")
    return worst


@contextlib.contextmanager
def exact_float32():
    """Turns TensorFloat-32 off for the block and restores the previous setting.

    Example:
    >>> import tensorflow as tf
    >>> with exact_float32():
    ...     tf.config.experimental.tensor_float_32_execution_enabled()
    False
    """
    import tensorflow as tf

    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(previous)


@contextlib.contextmanager
def dtype_policy(name: str | None):
    import keras

    if name is None:
        yield
        return
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def compare_to_one_device(
    strategy,
    build: Callable[[], object],
    workload: Callable[[object], dict],
    *,
    tolerance: float = 1e-5,
    policy: str | None = None,
    reference_build: Callable[[], object] | None = None,
) -> tuple[float, dict]:
    """Runs `workload` on one device and under `strategy` from the same weights.

    Args:
        strategy: The strategy under test.
        build: Returns a compiled Keras model (called once per side, in scope).
        workload: Trains / evaluates / predicts with the model and returns a dict of
            arrays to compare (it should include the final weights).
        tolerance: Largest allowed absolute difference. Defaults to `1e-5`.
        policy: Keras dtype policy for both sides. Defaults to `None` (float32).
        reference_build: Builds the one-device model instead of `build`, with the
            same weights in the same order: for a promise that differs from what
            Keras computes on one device (docs/keras_behaviours.md). Defaults to
            `None` (`build`).

    Returns:
        `(max_error, per_key_errors)`.

    Raises:
        CheckFailure: If any compared value differs by more than `tolerance`.
    """
    import keras

    with exact_float32(), dtype_policy(policy):
        keras.utils.set_random_seed(1234)
        reference_model = (reference_build or build)()
        initial = reference_model.get_weights()
        reference = workload(reference_model)
        with strategy.scope():
            model = build()
        model.set_weights(initial)
        candidate = workload(model)
    errors = {key: max_difference(reference[key], candidate[key]) for key in reference}
    worst = max(errors.values(), default=0.0)
    if not worst <= tolerance:
        ranked = sorted(errors.items(), key=lambda item: -item[1])
        raise CheckFailure(
            f"differs from one device by {worst:.3g} > {tolerance:g} "
            f"({', '.join(f'{k}: {v:.2g}' for k, v in ranked)})"
        )
    return worst, errors
