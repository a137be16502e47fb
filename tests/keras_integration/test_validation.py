"""Early errors for models built outside the strategy's scope, and what is allowed."""

import keras
import numpy as np
import pytest

import keras_replicator as kr


def _augmented_model(augmentation, strategy):
    with strategy.scope():
        inputs = keras.Input((8, 8, 1))
        x = inputs
        for layer in augmentation:
            x = layer(x)
        outputs = keras.layers.Dense(3)(keras.layers.Flatten()(x))
        model = keras.Model(inputs, outputs)
        model.compile(
            keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.random((64, 8, 8, 1), "float32"), rng.integers(0, 3, 64)


def test_random_layers_made_outside_the_scope_train():
    # The keras-io EfficientNet fine-tuning example makes its augmentation layers
    # (seed-generator state only) at module level, outside the scope.
    augmentation = [
        keras.layers.RandomRotation(0.15),
        keras.layers.RandomFlip(),
        keras.layers.RandomContrast(0.1),
    ]
    model = _augmented_model(augmentation, kr.MultiDeviceReplicator(num_replicas=2))
    x, y = _data()
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


def test_weights_made_outside_the_scope_are_still_an_error():
    outside = keras.layers.Dense(4)
    outside.build((None, 64))
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    model = _augmented_model([keras.layers.Reshape((64,)), outside], strategy)
    x, y = _data()
    with pytest.raises(ValueError, match=r"created outside the scope.*kernel"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
