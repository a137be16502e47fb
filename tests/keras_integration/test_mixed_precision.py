"""Mixed precision: an overflow in one replica's share skips the step everywhere.

TensorFlow's mixed-precision guide model (Dense relu x2, Dense, a float32 softmax;
shrunk) under `mixed_float16`, with one huge input in the first batch. On one
device the step's gradients overflow, Keras' `LossScaleOptimizer` skips it and
halves the loss scale. Keras takes that verdict from the first local replica's
un-reduced gradients; the huge input sits in one replica's share only, so before
the fix two replicas applied the step (inf weights) and two workers disagreed on
entering the all-reduce (a collective timeout).
"""

import keras
import numpy as np
import pytest

import keras_replicator as kr
from keras_replicator.launch import launch_function

# float16 forward passes: replica shares and the one-device batch round apart.
TOLERANCE = 1e-4


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8)).astype("float32")
    y = rng.integers(0, 4, 16)
    # Sample 6 (the second replica's share of the first batch): its float16
    # activations are ~1e4 and, times the loss scale, its gradients overflow.
    x[6], y[6] = 6e4, 0
    return x, y


def _model():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.Dense(16, activation="relu")(hidden)
    logits = keras.layers.Dense(4)(hidden)
    outputs = keras.layers.Activation("softmax", dtype="float32")(logits)
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    return model


def _train(strategy=None):
    """Two steps: the first overflows, the second trains; then one more epoch."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = _data()
        if strategy is None:
            model = _model()
        else:
            with strategy.scope():
                model = _model()
        optimizer = model.optimizer
        model.fit(x[:8], y[:8], batch_size=8, shuffle=False, verbose=0)
        after_overflow = {
            "scale": float(optimizer.dynamic_scale.numpy()),
            "iterations": int(optimizer.iterations.numpy()),
            "weights": model.get_weights(),
        }
        model.fit(x[8:], y[8:], batch_size=4, epochs=2, shuffle=False, verbose=0)
        return {
            "after_overflow": after_overflow,
            "scale": float(optimizer.dynamic_scale.numpy()),
            "iterations": int(optimizer.iterations.numpy()),
            "weights": model.get_weights(),
        }
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _check_matches_one_device(ours, one):
    skipped = one["after_overflow"]
    assert skipped["scale"] == 2.0**14 and skipped["iterations"] == 0, skipped
    initial = _initial_weights()
    for a, b in zip(skipped["weights"], initial):
        np.testing.assert_array_equal(a, b)  # one device skipped the step
    assert ours["after_overflow"]["scale"] == skipped["scale"]
    assert ours["after_overflow"]["iterations"] == 0
    for a, b in zip(ours["after_overflow"]["weights"], initial):
        np.testing.assert_array_equal(a, b)
    assert ours["scale"] == one["scale"] and ours["iterations"] == one["iterations"]
    assert one["iterations"] == 4
    for a, b in zip(ours["weights"], one["weights"]):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, atol=TOLERANCE, rtol=0)


def _initial_weights():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        return _model().get_weights()
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_an_overflow_in_one_replica_skips_the_step_on_both():
    ours = _train(kr.MultiDeviceReplicator(num_replicas=2))
    _check_matches_one_device(ours, _train())


def _train_on_a_worker():
    import keras_replicator as kr

    # A short timeout: before the fix, the workers disagreed on entering the
    # gradient all-reduce and the one inside it waited for the other.
    return _train(kr.MultiWorkerReplicator(collective_timeout=15))


@pytest.mark.slow(
    reason="covered in the default run by: "
    "conformance multi-worker-2 mixed_float16_overflow"
)
@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_an_overflow_on_one_worker_skips_the_step_on_both():
    chief, other = launch_function(_train_on_a_worker, 2, echo=False, timeout=240)
    _check_matches_one_device(chief, _train())
    for a, b in zip(chief["weights"], other["weights"]):
        np.testing.assert_array_equal(a, b)
