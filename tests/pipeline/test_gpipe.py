"""GPipe as a Keras model: transparency against one device, Keras API, errors."""

import keras
import numpy as np
import pytest

import keras_replicator as kr
from keras_replicator.pipeline import GPipe
from tests.pipeline import _models

CASES = [
    # (balance, num_microbatches, checkpoint)
    ([3], 1, "never"),
    ([2, 1], 1, "except_last"),
    ([1, 2], 2, "always"),
    ([2, 1], 3, "except_last"),
    ([1, 2], 4, "never"),
    ([1, 1, 1], 5, "always"),  # 16 samples in 5 uneven micro-batches
]


@pytest.mark.parametrize("balance,num_microbatches,checkpoint", CASES)
def test_trains_to_the_weights_of_one_device(balance, num_microbatches, checkpoint):
    plain, other = _models.twin(_models.mlp)
    pipe = GPipe(
        other, balance=balance, num_microbatches=num_microbatches, checkpoint=checkpoint
    )
    x, y = _models.data()
    h_plain = _models.train(plain, x, y, epochs=3)
    h_pipe = _models.train(pipe, x, y, epochs=3)
    assert _models.max_difference(plain.get_weights(), pipe.get_weights()) < 1e-5
    np.testing.assert_allclose(h_plain.history["loss"], h_pipe.history["loss"], 1e-5)


@pytest.mark.parametrize("checkpoint", ["always", "never"])
def test_float64_is_tighter(checkpoint):
    plain, other = _models.twin(_models.mlp, dtype="float64")
    pipe = GPipe(other, balance=[2, 1], num_microbatches=4, checkpoint=checkpoint)
    x, y = _models.data(dtype="float64")
    _models.train(plain, x, y)
    _models.train(pipe, x, y)
    assert _models.max_difference(plain.get_weights(), pipe.get_weights()) < 1e-12


def test_dropout_masks_do_not_depend_on_recomputation():
    runs = []
    for checkpoint in ("never", "always"):
        model = _models.mlp(dropout=0.5, seed=3)
        keras.utils.set_random_seed(5)
        pipe = GPipe(model, balance=[2, 2], num_microbatches=4, checkpoint=checkpoint)
        x, y = _models.data()
        _models.train(pipe, x, y)
        runs.append(pipe.get_weights())
    assert _models.max_difference(*runs) < 1e-6


def test_composes_with_lars_and_warmup():
    plain, other = _models.twin(_models.mlp)
    pipe = GPipe(other, balance=[2, 1], num_microbatches=4)
    x, y = _models.data()
    for model in (plain, pipe):
        _models.train(
            model,
            x,
            y,
            optimizer=kr.optimizers.LARS(0.5, momentum=0.9),
            callbacks=[kr.callbacks.LearningRateWarmup(warmup_epochs=1)],
        )
    assert _models.max_difference(plain.get_weights(), pipe.get_weights()) < 1e-5


def test_weights_follow_the_wrapped_model_order():
    plain, other = _models.twin(_models.mlp, batch_norm=True)
    pipe = GPipe(other, balance=[3, 1])
    assert [w.shape for w in pipe.get_weights()] == [
        w.shape for w in plain.get_weights()
    ]
    fresh = GPipe(_models.mlp(batch_norm=True, seed=9), balance=[1, 3])
    fresh.set_weights(plain.get_weights())
    assert _models.max_difference(fresh.get_weights(), plain.get_weights()) == 0


def test_predict_evaluate_and_a_list_of_unbuilt_layers():
    layers = [keras.layers.Dense(5, activation="relu"), keras.layers.Dense(2)]
    pipe = GPipe(layers, num_microbatches=3)
    pipe.compile(optimizer="sgd", loss="mse")
    x = np.ones((7, 4), "float32")
    assert pipe.predict(x, verbose=0).shape == (7, 2)
    plain = keras.Sequential(layers)
    np.testing.assert_allclose(pipe.predict(x, verbose=0), plain.predict(x, verbose=0))
    assert np.isfinite(pipe.evaluate(x, np.zeros((7, 2)), verbose=0))


def test_save_and_load_round_trip(tmp_path):
    pipe = GPipe(_models.mlp(batch_norm=True), balance=[2, 2], num_microbatches=2)
    x, y = _models.data()
    _models.train(pipe, x, y, epochs=1)
    path = tmp_path / "pipe.keras"
    pipe.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, GPipe)
    assert loaded.balance == [2, 2] and loaded.num_microbatches == 2
    assert _models.max_difference(loaded.get_weights(), pipe.get_weights()) == 0
    np.testing.assert_allclose(loaded.predict(x, verbose=0), pipe.predict(x, verbose=0))


def test_functional_chain_is_accepted():
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(4)(inputs)
    outputs = keras.layers.Dense(1)(hidden)
    pipe = GPipe(keras.Model(inputs, outputs))
    assert [len(s) for s in pipe.stages] == [1, 1]


def test_errors_name_the_argument():
    model = _models.mlp()
    with pytest.raises(ValueError, match=r"`balance` must sum to .* 3 layers"):
        GPipe(model, balance=[1, 1])
    with pytest.raises(ValueError, match="`balance` asks for 3 stages but there are"):
        GPipe(model, balance=[1, 1, 1], devices=["/cpu:0", "/cpu:1"])
    with pytest.raises(ValueError, match="`num_microbatches`"):
        GPipe(model, num_microbatches=0)
    with pytest.raises(ValueError, match="`checkpoint` must be one of"):
        GPipe(model, checkpoint="sometimes")
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(6)(inputs)
    residual = keras.layers.Add()([inputs, keras.layers.Dense(6)(hidden)])
    with pytest.raises(ValueError, match="`model_or_layers` has branches"):
        GPipe(keras.Model(inputs, residual))
    with pytest.raises(TypeError, match="`model_or_layers`"):
        GPipe("dense")
