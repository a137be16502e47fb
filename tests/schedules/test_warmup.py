import copy

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.schedules import Warmup

Schedules = keras.optimizers.schedules


def reference(step, *, target, start, warmup_steps, power, after):
    if step < warmup_steps:
        return start + (target - start) * (step / warmup_steps) ** power
    return after(step)


@pytest.mark.parametrize("power", [1.0, 2.0])
@pytest.mark.parametrize("start", [0.0, 0.05])
def test_delayed_schedule_ramps_to_its_first_value(power, start):
    decay = Schedules.ExponentialDecay(0.4, decay_steps=10, decay_rate=0.5)
    schedule = Warmup(decay, 20, start_learning_rate=start, warmup_power=power)
    for step in [0, 1, 7, 19, 20, 21, 35, 100]:
        expected = reference(
            step,
            target=0.4,
            start=start,
            warmup_steps=20,
            power=power,
            after=lambda s: 0.4 * 0.5 ** ((s - 20) / 10),
        )
        np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-6)


def test_undelayed_schedule_keeps_its_own_step_count():
    # Goyal et al.: warm up for 5 epochs, divide by 10 at epochs 30 and 60.
    steps_per_epoch = 10
    decay = Schedules.PiecewiseConstantDecay(
        [30 * steps_per_epoch, 60 * steps_per_epoch], [3.2, 0.32, 0.032]
    )
    schedule = Warmup(decay, 5 * steps_per_epoch, 0.1, delay_schedule=False)
    for step, expected in [
        (0, 0.1),
        (25, 0.1 + (3.2 - 0.1) * 0.5),
        (50, 3.2),
        (300, 3.2),
        (301, 0.32),
        (601, 0.032),
    ]:
        np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-6)


def test_constant_target_and_zero_warmup_steps():
    schedule = Warmup(2.0, warmup_steps=4)
    assert [float(schedule(s)) for s in range(6)] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0]
    no_warmup = Warmup(Schedules.CosineDecay(1.0, 10), warmup_steps=0)
    for step in (0, 5, 10):
        np.testing.assert_allclose(
            float(no_warmup(step)), float(Schedules.CosineDecay(1.0, 10)(step))
        )


def test_works_on_an_int64_step_inside_tf_function():
    schedule = Warmup(Schedules.PolynomialDecay(1.0, 100, 0.0), warmup_steps=10)
    traced = tf.function(lambda step: schedule(step))
    for step in (0, 5, 10, 60):
        assert float(traced(tf.constant(step, tf.int64))) == pytest.approx(
            float(schedule(step))
        )


def test_drives_an_optimizer():
    variable = keras.Variable(np.ones(2, "float32"))
    optimizer = keras.optimizers.SGD(Warmup(1.0, warmup_steps=4))
    rates = []
    for _ in range(6):
        rates.append(float(optimizer.learning_rate))
        optimizer.apply([np.ones(2, "float32")], [variable])
    assert rates == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


@pytest.mark.parametrize(
    "inner",
    [
        0.3,
        Schedules.CosineDecay(1.0, decay_steps=50, alpha=0.1),
        Warmup(Schedules.PolynomialDecay(1.0, 50), 5),  # nested: still serializable
    ],
)
def test_config_round_trip(inner):
    schedule = Warmup(
        inner,
        7,
        start_learning_rate=0.01,
        warmup_power=2.0,
        delay_schedule=False,
        name="w",
    )
    config = schedule.get_config()
    restored = Warmup.from_config(copy.deepcopy(config))
    assert restored.get_config() == config
    revived = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(schedule)
    )
    assert isinstance(revived, Warmup) and revived.get_config() == config
    for step in (0, 3, 7, 20):
        assert float(revived(step)) == pytest.approx(float(schedule(step)))


def test_survives_model_save_and_load(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    schedule = Warmup(Schedules.CosineDecay(0.1, 100), warmup_steps=10)
    model.compile(keras.optimizers.SGD(schedule), loss="mse")
    model.fit(np.ones((8, 3)), np.zeros(8), batch_size=4, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert float(loaded.optimizer.learning_rate) == pytest.approx(schedule(2))
    assert loaded.optimizer.get_config() == model.optimizer.get_config()


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        (("0.1", 5), {}, TypeError, "Received: schedule='0.1'"),
        ((lambda step: 0.1, 5), {}, TypeError, "LearningRateSchedule subclass"),
        ((0.1, 2.5), {}, TypeError, "Received: warmup_steps=2.5"),
        ((0.1, -1), {}, ValueError, "Received: warmup_steps=-1"),
        ((0.1, 5), {"warmup_power": 0}, ValueError, "Received: warmup_power=0"),
        ((0.1, 5), {"start_learning_rate": None}, TypeError, "start_learning_rate"),
    ],
)
def test_bad_arguments_fail_in_the_constructor(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        Warmup(*args, **kwargs)


def test_package_exports():
    from keras_replicator import schedules

    assert sorted(schedules.__all__) == [
        "PolynomialDecayWithWarmup",
        "Warmup",
        "scaled_learning_rate",
    ]
    for name in schedules.__all__:
        assert getattr(schedules, name) is not None
