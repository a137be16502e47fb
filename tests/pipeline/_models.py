"""Small models and data shared by the pipeline tests."""

import keras
import numpy as np


def mlp(dtype="float32", batch_norm=False, dropout=0.0, seed=0):
    keras.utils.set_random_seed(seed)
    layers = [
        keras.Input((6,), dtype=dtype),
        keras.layers.Dense(16, activation="relu", dtype=dtype),
    ]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization(dtype=dtype))
    if dropout:
        layers.append(keras.layers.Dropout(dropout, seed=seed))
    layers += [
        keras.layers.Dense(8, activation="tanh", dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ]
    return keras.Sequential(layers)


def twin(build, **kwargs):
    """Two models with equal weights: the plain one and one to wrap."""
    plain, other = build(**kwargs), build(**kwargs)
    other.set_weights(plain.get_weights())
    return plain, other


def data(n=48, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 6)).astype(dtype), rng.random((n, 3)).astype(dtype)


def train(model, x, y, optimizer=None, epochs=2, batch_size=16, callbacks=None):
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1), loss="mse")
    return model.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )


def max_difference(a, b):
    return max(float(np.abs(u - v).max()) for u, v in zip(a, b))
