import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.callbacks import LearningRateWarmup
from keras_replicator.optimizers import LARS
from keras_replicator.schedules import Warmup


class RecordLearningRate(keras.callbacks.Callback):
    """Records the learning rate each step runs with (placed after the warmup)."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(self.model.optimizer.learning_rate))


def _linear_data(num_samples=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_samples, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.1).astype("float32")
    return x, y


def _linear_model(optimizer, strategy=None):
    with (strategy or tf.distribute.get_strategy()).scope():
        model = keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(
                    1,
                    use_bias=False,
                    kernel_initializer=keras.initializers.Constant(0.3),
                ),
            ]
        )
        model.compile(optimizer, loss="mse")
    return model


def ramp(step, *, start, target, warmup_steps):
    return start + (target - start) * min(1.0, step / warmup_steps)


def test_learning_rate_ramps_per_step_then_stays_at_the_target():
    x, y = _linear_data()
    model = _linear_model(keras.optimizers.SGD(0.8))
    record = RecordLearningRate()
    warmup = LearningRateWarmup(warmup_epochs=1.5, start_learning_rate=0.2)
    history = model.fit(
        x, y, batch_size=16, epochs=3, verbose=0, callbacks=[warmup, record]
    )
    expected = [ramp(s, start=0.2, target=0.8, warmup_steps=6) for s in range(12)]
    np.testing.assert_allclose(record.rates, expected, rtol=1e-6)
    np.testing.assert_allclose(
        history.history["learning_rate"], [expected[3], expected[7], 0.8], rtol=1e-6
    )
    assert warmup.target_learning_rate == pytest.approx(0.8)


def test_resuming_with_initial_epoch_continues_the_ramp():
    x, y = _linear_data()
    model = _linear_model(keras.optimizers.SGD(0.8))
    record = RecordLearningRate()
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        initial_epoch=1,
        verbose=0,
        callbacks=[LearningRateWarmup(warmup_epochs=2), record],
    )
    expected = [ramp(s, start=0.0, target=0.8, warmup_steps=8) for s in range(4, 8)]
    np.testing.assert_allclose(record.rates, expected, rtol=1e-6)


def test_leaves_the_learning_rate_alone_after_warmup():
    x, y = _linear_data()
    model = _linear_model(keras.optimizers.SGD(0.8))
    decay = keras.callbacks.LearningRateScheduler(
        lambda epoch, lr: 0.01 if epoch >= 2 else lr
    )
    warmup = LearningRateWarmup(warmup_epochs=1)
    record = RecordLearningRate()
    model.fit(
        x, y, batch_size=16, epochs=3, verbose=0, callbacks=[decay, warmup, record]
    )
    assert record.rates[4] == pytest.approx(0.8)
    np.testing.assert_allclose(record.rates[8:], [0.01] * 4, rtol=1e-6)


def sgd_reference(x, y, w, rates, *, momentum, batch_size, correction):
    """Keras SGD (v = m v - lr g; w += v) with Goyal's momentum correction."""
    w = w.astype(np.float64)
    v = np.zeros_like(w)
    previous = None
    for step, lr in enumerate(rates):
        start = (step * batch_size) % len(x)
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        gradient = 2.0 / len(xb) * xb.T @ (xb @ w - yb)
        if correction and previous:
            v = v * (lr / previous)
        v = momentum * v - lr * gradient
        w = w + v
        previous = lr
    return w


@pytest.mark.parametrize("correction", [False, True])
def test_momentum_correction_matches_goyal_et_al(correction):
    x, y = _linear_data()
    model = _linear_model(keras.optimizers.SGD(0.2, momentum=0.9))
    record = RecordLearningRate()
    warmup = LearningRateWarmup(
        warmup_epochs=2, start_learning_rate=0.02, momentum_correction=correction
    )
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=3,
        shuffle=False,
        verbose=0,
        callbacks=[warmup, record],
    )
    common = {"momentum": 0.9, "batch_size": 16}
    expected = sgd_reference(
        x, y, np.full((3, 1), 0.3), record.rates, correction=correction, **common
    )
    other = sgd_reference(
        x, y, np.full((3, 1), 0.3), record.rates, correction=not correction, **common
    )
    got = model.get_weights()[0]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert np.abs(got - other).max() > 1e-3  # the test can tell the two apart


def test_momentum_correction_with_lars_in_a_loss_scale_optimizer_on_two_replicas():
    x, y = _linear_data()
    weights = []
    two = kr.MultiDeviceReplicator(num_replicas=2)
    for strategy in (tf.distribute.get_strategy(), two):
        with strategy.scope():  # the optimizer's variables belong to the strategy
            optimizer = keras.optimizers.LossScaleOptimizer(LARS(50.0))
        model = _linear_model(optimizer, strategy)
        warmup = LearningRateWarmup(warmup_epochs=1, momentum_correction=True)
        model.fit(
            x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[warmup]
        )
        weights.append(model.get_weights()[0])
        assert model.optimizer.learning_rate.numpy() == pytest.approx(50.0)
    np.testing.assert_allclose(weights[0], weights[1], atol=1e-5)
    assert not np.allclose(weights[0], 0.3)


def test_a_learning_rate_schedule_is_a_clear_error():
    x, y = _linear_data()
    model = _linear_model(keras.optimizers.SGD(Warmup(0.1, 5)))
    with pytest.raises(ValueError, match="keras_replicator.schedules.Warmup"):
        model.fit(x, y, verbose=0, callbacks=[LearningRateWarmup()])


def test_momentum_correction_needs_a_velocity_that_includes_the_learning_rate():
    x, y = _linear_data()
    model = _linear_model(keras.optimizers.Adam(0.1))
    with pytest.raises(ValueError, match="Received: optimizer=Adam"):
        model.fit(
            x, y, verbose=0, callbacks=[LearningRateWarmup(momentum_correction=True)]
        )


def test_unknown_epoch_length_needs_steps_per_epoch():
    x, y = _linear_data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True)
    dataset = dataset.batch(16)  # filter(): cardinality unknown
    model = _linear_model(keras.optimizers.SGD(0.8))
    with pytest.raises(ValueError, match="Pass `steps_per_epoch`"):
        model.fit(dataset, epochs=1, verbose=0, callbacks=[LearningRateWarmup()])
    record = RecordLearningRate()
    warmup = LearningRateWarmup(warmup_epochs=1, steps_per_epoch=4)
    model.fit(dataset, epochs=1, verbose=0, callbacks=[warmup, record])
    # Keras starts a 5th step before it finds the end of the data.
    np.testing.assert_allclose(record.rates[:4], [0.0, 0.2, 0.4, 0.6], rtol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"warmup_epochs": 0}, "Received: warmup_epochs=0"),
        ({"warmup_epochs": "5"}, "Received: warmup_epochs='5'"),
        ({"start_learning_rate": -0.1}, "Received: start_learning_rate=-0.1"),
        ({"steps_per_epoch": 0}, "Received: steps_per_epoch=0"),
        ({"target_learning_rate": 0.0}, "Received: target_learning_rate=0.0"),
    ],
)
def test_bad_arguments_fail_in_the_constructor(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LearningRateWarmup(**kwargs)


def test_explicit_target_for_resuming_from_a_checkpoint_written_during_warmup():
    x, y = _linear_data()
    model = _linear_model(keras.optimizers.SGD(0.3))  # a warmup value, restored
    record = RecordLearningRate()
    warmup = LearningRateWarmup(warmup_epochs=2, target_learning_rate=0.8)
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        initial_epoch=1,
        verbose=0,
        callbacks=[warmup, record],
    )
    expected = [ramp(s, start=0.0, target=0.8, warmup_steps=8) for s in range(4, 8)]
    np.testing.assert_allclose(record.rates, expected, rtol=1e-6)
