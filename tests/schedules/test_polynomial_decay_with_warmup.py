import copy

import keras
import numpy as np
import pytest

from keras_replicator.schedules import PolynomialDecayWithWarmup, Warmup


def mlperf(step, *, peak, warmup_steps, decay_steps, end, power, start):
    """The MLPerf ResNet-50 LARS schedule, written from its definition."""
    if step < warmup_steps:
        return start + (peak - start) * step / warmup_steps
    progress = min(step - warmup_steps, decay_steps) / decay_steps
    return (peak - end) * (1 - progress) ** power + end


@pytest.mark.parametrize("start", [0.0, 0.5])
@pytest.mark.parametrize("power", [2.0, 1.0])
def test_values_match_the_definition(start, power):
    schedule = PolynomialDecayWithWarmup(
        peak_learning_rate=9.5,
        warmup_steps=25,
        decay_steps=175,
        end_learning_rate=1e-4,
        power=power,
        start_learning_rate=start,
    )
    for step in [0, 1, 12, 24, 25, 26, 100, 199, 200, 250]:
        expected = mlperf(
            step,
            peak=9.5,
            warmup_steps=25,
            decay_steps=175,
            end=1e-4,
            power=power,
            start=start,
        )
        np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-5)


def test_is_a_warmup_over_keras_polynomial_decay():
    schedule = PolynomialDecayWithWarmup(1.0, warmup_steps=5, decay_steps=10)
    assert isinstance(schedule, Warmup)
    assert isinstance(schedule.schedule, keras.optimizers.schedules.PolynomialDecay)
    assert schedule.schedule.power == 2.0 and schedule.power == 2.0


def test_config_round_trip_and_keras_serialization():
    schedule = PolynomialDecayWithWarmup(
        2.0,
        10,
        90,
        end_learning_rate=0.0,
        power=3.0,
        start_learning_rate=0.1,
        name="mlperf",
    )
    config = schedule.get_config()
    assert config == {
        "peak_learning_rate": 2.0,
        "warmup_steps": 10,
        "decay_steps": 90,
        "end_learning_rate": 0.0,
        "power": 3.0,
        "start_learning_rate": 0.1,
        "name": "mlperf",
    }
    restored = PolynomialDecayWithWarmup.from_config(copy.deepcopy(config))
    assert restored.get_config() == config
    revived = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(schedule)
    )
    assert type(revived) is PolynomialDecayWithWarmup
    for step in (0, 5, 50, 100):
        assert float(revived(step)) == pytest.approx(float(schedule(step)))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"decay_steps": 0}, ValueError, "Received: decay_steps=0"),
        ({"decay_steps": 10.0}, TypeError, "Received: decay_steps=10.0"),
        ({"peak_learning_rate": 0}, ValueError, "peak_learning_rate=0"),
        ({"warmup_steps": -2}, ValueError, "Received: warmup_steps=-2"),
    ],
)
def test_bad_arguments_fail_in_the_constructor(kwargs, error, message):
    arguments = {"peak_learning_rate": 1.0, "warmup_steps": 5, "decay_steps": 10}
    with pytest.raises(error, match=message):
        PolynomialDecayWithWarmup(**{**arguments, **kwargs})
