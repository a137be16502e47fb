import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.callbacks import TrustRatioLogger
from keras_replicator.optimizers import LARS
from keras_replicator.testing import _workloads


def _model(optimizer=None, strategy=None):
    with (strategy or tf.distribute.get_strategy()).scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((_workloads.NUM_FEATURES,)),
                keras.layers.Dense(16, activation="relu", name="first"),
                keras.layers.Dense(16, activation="relu", name="second"),
                keras.layers.Dense(_workloads.NUM_CLASSES, name="out"),
            ],
            name="net",
        )
        model.compile(
            optimizer or LARS(1.0, weight_decay=1e-4),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def _fit(model, callbacks, epochs=2):
    x, y = _workloads.classification_data(64)
    return model.fit(
        x,
        y,
        batch_size=16,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )


def _ratios(model):
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    return {k: float(v.numpy()) for k, v in optimizer.trust_ratios.items()}


def test_logs_one_mean_per_layer_by_default():
    model = _model()
    history = _fit(model, [TrustRatioLogger()])
    keys = [key for key in history.history if key.startswith("trust_ratio/")]
    assert keys == [
        "trust_ratio/net/first/mean",
        "trust_ratio/net/second/mean",
        "trust_ratio/net/out/mean",
    ]
    ratios = _ratios(model)
    for layer in ("first", "second", "out"):
        logged = history.history[f"trust_ratio/net/{layer}/mean"]
        assert len(logged) == 2 and logged[-1] == pytest.approx(
            ratios[f"net/{layer}/kernel"]
        )
        assert 0 < logged[-1] < 1


def test_groups_statistics_and_effective_learning_rate():
    model = _model()
    logger = TrustRatioLogger(
        groups={"hidden": "(first|second)/", "head": "^net/out/"},
        statistics=["min", "mean", "max"],
        effective_learning_rate=True,
        prefix="lars",
    )
    history = _fit(model, [logger])
    ratios = _ratios(model)
    hidden = [ratios["net/first/kernel"], ratios["net/second/kernel"]]
    logs = {key: values[-1] for key, values in history.history.items()}
    assert logs["lars/hidden/min"] == pytest.approx(min(hidden))
    assert logs["lars/hidden/max"] == pytest.approx(max(hidden))
    assert logs["lars/hidden/mean"] == pytest.approx(np.mean(hidden))
    assert logs["lars/hidden/effective_lr"] == pytest.approx(1.0 * np.mean(hidden))
    assert logs["lars/head/mean"] == pytest.approx(ratios["net/out/kernel"])


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ("all", ["trust_ratio/all/mean"]),
        (
            "variable",
            [f"trust_ratio/net/{n}/kernel/mean" for n in ("first", "second", "out")],
        ),
    ],
)
def test_all_and_per_variable_groups(groups, expected):
    history = _fit(_model(), [TrustRatioLogger(groups=groups)], epochs=1)
    assert [key for key in history.history if key.startswith("trust_ratio")] == expected


def test_batch_logs_every_n_batches():
    seen = {}

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen[batch] = "trust_ratio/net/out/mean" in logs

    _fit(_model(), [TrustRatioLogger(update_freq=2), Record()], epochs=1)
    assert seen == {0: False, 1: True, 2: False, 3: True}


def test_loss_scale_optimizer_and_two_replicas_log_the_one_device_values():
    one = _model()
    one_history = _fit(one, [TrustRatioLogger(groups="all")])
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    with strategy.scope():
        optimizer = keras.optimizers.LossScaleOptimizer(LARS(1.0, weight_decay=1e-4))
    two = _model(optimizer, strategy)
    two_history = _fit(two, [TrustRatioLogger(groups="all")])
    np.testing.assert_allclose(
        one_history.history["trust_ratio/all/mean"],
        two_history.history["trust_ratio/all/mean"],
        rtol=1e-4,
    )


def test_other_optimizers_are_a_clear_error():
    model = _model(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="Received: optimizer=SGD"):
        _fit(model, [TrustRatioLogger()])


def test_a_group_that_matches_nothing_fails_after_the_first_step():
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(batch)

    with pytest.raises(ValueError, match="'typo': 'frist' matches no variable"):
        _fit(_model(), [TrustRatioLogger(groups={"typo": "frist"}), Record()])
    assert seen == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"groups": "layers"}, "Received: groups='layers'"),
        ({"groups": {"a": "("}}, "invalid regular expression"),
        ({"statistics": ["median"]}, "Received: statistics=\\['median'\\]"),
        ({"statistics": []}, "non-empty"),
        ({"update_freq": "batch"}, "Received: update_freq='batch'"),
        ({"update_freq": 0}, "Received: update_freq=0"),
    ],
)
def test_bad_arguments_fail_in_the_constructor(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrustRatioLogger(**kwargs)
