"""A small model trained sharded and not, for the sharding tests (float64 by default).

The dataset has 150 examples at batch 16: 10 steps an epoch, the last one with 6
examples (uneven over 4 replicas); the layers' variables have 35, 5, 15 and 3
elements, none a multiple of 2 or 4.
"""

import keras
import numpy as np

import keras_replicator as kr

EXAMPLES, BATCH = 150, 16


def data(dtype="float64"):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 7)).astype(dtype)
    y = rng.normal(size=(EXAMPLES, 3)).astype(dtype)
    return x, y


def strategy(replicas, shard, **options):
    if replicas == 1:
        return kr.MultiDeviceReplicator(num_replicas=1)
    return kr.MultiDeviceReplicator(
        num_replicas=replicas,
        all_reduce=kr.AllReduceOptions(shard_weight_update=shard, **options),
    )


def model_in(strategy, optimizer, dtype="float64", **compile_kwargs):
    """The model, compiled in `strategy`'s scope; its loss computes in `dtype`."""
    keras.utils.set_random_seed(1)
    floatx = keras.config.floatx()
    keras.config.set_floatx(dtype)  # the loss takes floatx when compiled
    try:
        return _build(strategy, optimizer, dtype, compile_kwargs)
    finally:
        keras.config.set_floatx(floatx)


def _build(strategy, optimizer, dtype, compile_kwargs):
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((7,), dtype=dtype),
                keras.layers.Dense(5, activation="tanh", dtype=dtype),
                keras.layers.Dense(3, dtype=dtype),
            ]
        )
        model.compile(optimizer(), loss="mse", **compile_kwargs)
    return model


def fit(model, epochs=2, dtype="float64"):
    x, y = data(dtype)
    model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, shuffle=False)
    return model


def weights(model):
    return [w.numpy() for w in model.weights]


def optimizer_state(model):
    """The optimizer's variables as Keras saves them (sharded slots gathered)."""
    store = {}
    model.optimizer.save_own_variables(store)
    return [np.asarray(store[str(i)]) for i in range(len(store))]


def max_difference(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert np.shape(x) == np.shape(y)
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b)
    )


def assert_same_training(plain, sharded, tolerance):
    """Weights and optimizer state of two trained models agree to `tolerance`."""
    assert max_difference(weights(plain), weights(sharded)) <= tolerance
    assert max_difference(optimizer_state(plain), optimizer_state(sharded)) <= tolerance
