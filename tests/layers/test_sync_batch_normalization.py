import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.testing import _workloads as w

# 4 replicas, each with a different batch of 3 rows and 2 channels.
DATA = (np.arange(24, dtype="float32").reshape(4, 3, 2) ** 1.5).astype("float32")


@pytest.fixture(scope="module")
def strategy():
    return kr.MultiDeviceReplicator(num_replicas=4)


def _run_layer(strategy, layer):
    @tf.function
    def step():
        def replica_fn():
            index = tf.distribute.get_replica_context().replica_id_in_sync_group
            return layer(tf.gather(tf.constant(DATA), index), training=True)

        return strategy.experimental_local_results(strategy.run(replica_fn))

    return np.stack([np.asarray(v) for v in step()])


@pytest.mark.parametrize(
    "group_size, groups",
    [(2, [[0, 1], [2, 3]]), (None, [[0, 1, 2, 3]]), (1, [[0], [1], [2], [3]])],
)
def test_exact_group_statistics_on_4_replicas(strategy, group_size, groups):
    with strategy.scope():
        layer = kr.layers.SyncBatchNormalization(
            group_size=group_size, momentum=0.5, epsilon=0.0
        )
        layer.build((None, 2))
    outputs = _run_layer(strategy, layer)
    means, variances = [], []
    for group in groups:
        rows = DATA[group].reshape(-1, 2)
        mean, variance = rows.mean(0), rows.var(0)  # biased variance
        means.append(mean)
        variances.append(variance)
        for r in group:
            expected = (DATA[r] - mean) / np.sqrt(variance)
            np.testing.assert_allclose(outputs[r], expected, rtol=1e-5, atol=1e-5)
    # Moving statistics: Keras' update, averaged over replicas, same on each.
    per_replica_mean = np.mean([means[i // len(groups[0])] for i in range(4)], 0)
    per_replica_var = np.mean([variances[i // len(groups[0])] for i in range(4)], 0)
    for value in layer.moving_mean.value.values:
        np.testing.assert_allclose(value.numpy(), 0.5 * per_replica_mean, rtol=1e-5)
    for value in layer.moving_variance.value.values:
        np.testing.assert_allclose(
            value.numpy(), 0.5 + 0.5 * per_replica_var, rtol=1e-5
        )


def _bn_mlp(layer):
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    outputs = keras.layers.Dense(3, dtype="float32")(layer(hidden))
    model = keras.Model(inputs, outputs)
    model.compile(
        keras.optimizers.SGD(0.1, momentum=0.5),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


@pytest.mark.parametrize(
    "policy, tolerance", [("float32", 1e-5), ("mixed_float16", 5e-3)]
)
def test_all_replicas_group_trains_like_one_device(policy, tolerance):
    x, y = w.classification_data(1024)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        reference = _bn_mlp(keras.layers.BatchNormalization())
        initial = reference.get_weights()
        reference.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
        with kr.MultiDeviceReplicator(num_replicas=2).scope():
            model = _bn_mlp(kr.layers.SyncBatchNormalization())
        model.set_weights(initial)
        model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    finally:
        keras.config.set_dtype_policy(previous)
    worst = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(reference.get_weights(), model.get_weights())
    )
    assert worst < tolerance


def test_config_round_trip_and_model_save_load(tmp_path):
    layer = kr.layers.SyncBatchNormalization(group_size=2, momentum=0.9)
    clone = kr.layers.SyncBatchNormalization.from_config(layer.get_config())
    assert clone.group_size == 2 and clone.momentum == 0.9
    with kr.MultiDeviceReplicator(num_replicas=4).scope():
        model = _bn_mlp(kr.layers.SyncBatchNormalization(group_size=2))
    x, y = w.classification_data(256)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.layers[2], kr.layers.SyncBatchNormalization)
    assert loaded.layers[2].group_size == 2
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6
    )


def test_one_device_with_a_group_larger_than_the_replicas():
    layer = kr.layers.SyncBatchNormalization(group_size=8, epsilon=0.0)
    x = np.array([[1.0], [3.0]], dtype="float32")
    np.testing.assert_allclose(layer(x, training=True).numpy(), [[-1.0], [1.0]])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"synchronized": True}, "synchronized=True"),
        ({"renorm": True}, "renorm=True"),
        ({"group_size": 0}, "group_size=0"),
        ({"group_size": 1.5}, "group_size=1.5"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kr.layers.SyncBatchNormalization(**kwargs)


def test_group_that_does_not_divide_the_replicas(strategy):
    with strategy.scope():
        layer = kr.layers.SyncBatchNormalization(group_size=3)
        layer.build((None, 2))
    with pytest.raises(ValueError, match="must divide the 4 replicas"):
        _run_layer(strategy, layer)
