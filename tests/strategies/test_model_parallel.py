"""ModelParallelReplicator: a LayoutMap on a 2x2 mesh of 4 logical CPUs equals one
device (float64, 1e-10) in fit / evaluate / predict, saves whole weights, and
refuses layouts it would have to ignore.
"""

import keras
import numpy as np
import pytest

import keras_replicator as kr

TOLERANCE = 1e-10


def megatron_layout_map(shape=(2, 2)):
    """Column-split first Dense, row-split second (Megatron's MLP)."""
    mesh = keras.distribution.DeviceMesh(shape, ["batch", "model"], kr.devices(4))
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[".*hidden/kernel"] = (None, "model")
    layout_map[".*hidden/bias"] = ("model",)
    layout_map[".*logits/kernel"] = ("model", None)
    return layout_map


def build(optimizer="sgd"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.Dense(4, name="logits"),
        ]
    )
    optimizers = {
        "sgd": keras.optimizers.SGD(0.1),
        "momentum": keras.optimizers.SGD(0.1, momentum=0.5),
        "adam": keras.optimizers.Adam(0.01),
    }
    model.compile(
        optimizer=optimizers[optimizer],
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def data(rows=70):
    rng = np.random.default_rng(0)
    return rng.normal(size=(rows, 8)), rng.integers(0, 4, rows)


def max_gap(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_fit_evaluate_predict_equal_one_device(float64, optimizer):
    # 70 rows at batch 16: the last batch of 6 is split too, 2 epochs = 10 steps.
    x, y = data()
    one_device = build(optimizer)
    expected = one_device.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    strategy = kr.ModelParallelReplicator(megatron_layout_map())
    with strategy.scope():
        model = build(optimizer)
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)

    for name in ("loss", "accuracy"):
        assert history.history[name] == pytest.approx(
            expected.history[name], abs=TOLERANCE
        )
    assert max_gap(model.get_weights(), one_device.get_weights()) < TOLERANCE
    assert model.evaluate(x, y, batch_size=16, verbose=0) == pytest.approx(
        one_device.evaluate(x, y, batch_size=16, verbose=0), abs=TOLERANCE
    )
    np.testing.assert_allclose(
        model.predict(x, batch_size=16, verbose=0),
        one_device.predict(x, batch_size=16, verbose=0),
        rtol=0,
        atol=TOLERANCE,
    )


def test_weights_and_their_slots_are_split_as_the_map_says(float64):
    strategy = kr.ModelParallelReplicator(megatron_layout_map())
    with strategy.scope():
        model = build("adam")
    model.fit(*data(16), batch_size=16, verbose=0)
    specs = {
        v.path.split("/", 1)[1]: strategy.layout_of(v).sharding_specs
        for v in model.weights
    }
    assert specs == {
        "hidden/kernel": ["unsharded", "model"],
        "hidden/bias": ["model"],
        "logits/kernel": ["model", "unsharded"],
        "logits/bias": ["unsharded"],
    }
    slots = {
        v.path.rsplit("/", 1)[1]: strategy.layout_of(v).sharding_specs
        for v in model.optimizer.variables
        if "hidden_kernel" in v.path
    }
    assert slots and all(spec == ["unsharded", "model"] for spec in slots.values())


def test_model_axis_of_2_halves_the_weight_bytes_per_device(float64):
    # The target: <= 0.55x of the replicated model per device.
    strategy = kr.ModelParallelReplicator(megatron_layout_map())
    with strategy.scope():
        model = build()
    per_device = strategy.bytes_per_device(model.weights)
    whole = sum(w.nbytes for w in model.get_weights())
    # hidden 8x16 + 16 and logits 16x4 split in 2; the logits bias (4) is whole.
    assert per_device == [(8 * 16 + 16 + 16 * 4) * 8 // 2 + 4 * 8] * 4
    assert max(per_device) / whole <= 0.55


def test_a_keras_file_saved_on_the_mesh_loads_on_one_device_and_another_mesh(
    float64, tmp_path
):
    x, y = data()
    strategy = kr.ModelParallelReplicator(megatron_layout_map())
    with strategy.scope():
        model = build()
    model.fit(x, y, batch_size=16, verbose=0)
    expected = model.predict(x, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)

    one_device = keras.models.load_model(path)
    np.testing.assert_allclose(one_device.predict(x, verbose=0), expected, atol=1e-12)
    four_by_one = kr.ModelParallelReplicator(megatron_layout_map((4, 1)))
    with four_by_one.scope():
        reloaded = keras.models.load_model(path)
    assert four_by_one.layout_of(reloaded.weights[0]).sharding_specs == [
        "unsharded",
        "model",
    ]
    np.testing.assert_allclose(reloaded.predict(x, verbose=0), expected, atol=1e-12)
    # And the other way: one device's weights into the mesh's layouts.
    with strategy.scope():
        target = build()
    target.set_weights(one_device.get_weights())
    np.testing.assert_allclose(target.predict(x, verbose=0), expected, atol=1e-12)


def test_a_key_that_matches_no_variable_is_an_error_at_fit():
    layout_map = megatron_layout_map()
    layout_map[".*/no_such_layer/kernel"] = (None, "model")
    strategy = kr.ModelParallelReplicator(layout_map)
    with strategy.scope():
        model = build()
    with pytest.raises(
        ValueError, match=r"no_such_layer/kernel'\] matched no variable"
    ):
        model.fit(*data(16), verbose=0)


def test_an_axis_the_mesh_lacks_is_an_error_naming_the_key():
    # Keras' LayoutMap refuses a tuple naming an unknown axis itself; a
    # TensorLayout made on another mesh gets in.
    layout_map = megatron_layout_map()
    other = keras.distribution.DeviceMesh((4,), ["tensor"], kr.devices(4))
    layout_map[".*/logits/bias"] = keras.distribution.TensorLayout(("tensor",), other)
    with pytest.raises(
        ValueError, match=r"'\.\*/logits/bias' shards over axes \['tensor'\]"
    ):
        kr.ModelParallelReplicator(layout_map)


def test_a_dimension_the_axis_does_not_divide_is_an_error_naming_the_variable():
    mesh = keras.distribution.DeviceMesh((1, 4), ["batch", "model"], kr.devices(4))
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[".*logits/kernel"] = (None, "model")  # 4 classes: fine
    layout_map[".*hidden/kernel"] = ("model", None)  # 8 rows: fine
    layout_map[".*hidden/bias"] = ("model",)
    strategy = kr.ModelParallelReplicator(layout_map)
    with strategy.scope():
        keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="hidden")])
    with pytest.raises(ValueError, match=r"6 is not a multiple of the 4 devices"):
        with strategy.scope():
            keras.Sequential([keras.Input((8,)), keras.layers.Dense(6, name="hidden")])


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="Received: layout_map=\\{"):
        kr.ModelParallelReplicator({"dense/kernel": (None, "model")})
    with pytest.raises(ValueError, match="Received: batch_dim_name='data'"):
        kr.ModelParallelReplicator(megatron_layout_map(), batch_dim_name="data")
    with pytest.raises(TypeError, match="Received: count=None"):
        kr.devices(None)
    mesh = keras.distribution.DeviceMesh((2,), ["batch"], ["cpu:0", "cpu:7"])
    with pytest.raises(ValueError, match="not among"):
        kr.ModelParallelReplicator(keras.distribution.LayoutMap(mesh))


def test_is_a_tf_distribute_strategy_with_one_replica():
    import tensorflow as tf

    strategy = kr.ModelParallelReplicator(megatron_layout_map())
    assert isinstance(strategy, tf.distribute.Strategy)
    assert strategy.num_replicas_in_sync == 1
    assert "ModelParallelReplicator" in kr.__all__ and "devices" in kr.__all__
    assert (
        repr(strategy)
        == "ModelParallelReplicator(mesh=(batch=2, model=2), batch='batch')"
    )


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_fully_sharded_equals_one_device_and_keeps_about_half_per_device(
    float64, optimizer
):
    # Issue 52: N=2, weights + slots per device <= 0.6x, numbers = one device.
    x, y = data()
    one_device = build(optimizer)
    one_device.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    mesh = keras.distribution.DeviceMesh((2,), ["batch"], kr.devices(2))
    strategy = kr.ModelParallelReplicator(
        keras.distribution.LayoutMap(mesh), fully_shard=True
    )
    with strategy.scope():
        model = build(optimizer)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert max_gap(model.get_weights(), one_device.get_weights()) < TOLERANCE

    state = model.weights + model.optimizer.variables
    per_device = strategy.bytes_per_device(state)
    whole = sum(np.asarray(v).nbytes for v in state)
    assert max(per_device) / whole <= 0.6, (per_device, whole)
    specs = {
        v.path.split("/", 1)[1]: strategy.layout_of(v).sharding_specs
        for v in model.weights
    }
    assert specs["hidden/kernel"] == ["unsharded", "batch"]  # the last dimension
    assert specs["logits/bias"] == ["batch"]


def test_adam_on_a_repeating_embedding_fully_sharded_is_dense_adam():
    # Before its IndexedSlices gradient was made dense, Adam's first step moved
    # no weight on the mesh (the slots were right).
    from keras_replicator.testing import _day_one_checks

    mesh = keras.distribution.DeviceMesh((2,), ["batch"], kr.devices(2))
    strategy = kr.ModelParallelReplicator(
        keras.distribution.LayoutMap(mesh), fully_shard=True
    )
    worst, _ = _day_one_checks.adam_on_embeddings(strategy)
    assert worst < 1e-5
