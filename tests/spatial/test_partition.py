"""`kr.spatial.partition`: training, evaluation and prediction equal one device."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr

HEIGHT, WIDTH = 16, 6
STEPS, BATCH = 5, 8


def conv_net(batch_norm="plain", seed=1):
    """Every partitionable layer kind, then global pooling and a dense head."""
    keras.utils.set_random_seed(seed)
    norm = (
        keras.layers.BatchNormalization(momentum=0.5)
        if batch_norm == "plain"
        else kr.layers.SyncBatchNormalization(group_size=None, momentum=0.5)
    )
    inputs = keras.Input((HEIGHT, WIDTH, 2))
    x = keras.layers.Conv2D(4, 3, padding="same")(inputs)
    x = keras.layers.ReLU()(norm(x))
    x = keras.layers.MaxPooling2D(2)(x)
    y = keras.layers.Conv2D(6, 3, strides=2, padding="same", activation="relu")(x)
    y = keras.layers.DepthwiseConv2D(3, padding="same")(y)
    y = keras.layers.SeparableConv2D(6, 3, dilation_rate=1, padding="same")(y)
    y = keras.layers.AveragePooling2D(3, strides=1, padding="same")(y)
    z = keras.layers.Conv2D(6, 1, strides=2)(x)
    x = keras.layers.Add()([y, z])
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3)(x)
    return keras.Model(inputs, outputs)


def data(count=STEPS * BATCH, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, HEIGHT, WIDTH, 2))
    return x, rng.integers(0, 3, size=count)


def compile_sgd(model):
    model.compile(
        keras.optimizers.SGD(0.1, momentum=0.5),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def max_difference(a, b):
    assert [w.shape for w in a] == [w.shape for w in b]
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b))


LAYOUTS = [  # (replicas, parts, batch norm): spatial x data parallel
    (2, 2, "plain"),
    pytest.param(
        4,
        2,
        "sync_all",
        marks=pytest.mark.slow(
            reason="covered in the default run by: the same test [2-2-plain] and the "
            "other cases"
        ),
    ),
    pytest.param(4, 4, "plain", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("replicas,parts,batch_norm", LAYOUTS)
def test_five_fit_steps_give_the_weights_of_one_device(
    float64, strategies, replicas, parts, batch_norm
):
    x, y = data()
    plain = compile_sgd(conv_net(batch_norm))
    spatial = kr.spatial.partition(plain, parts, strategy=strategies[replicas])
    assert max_difference(plain.get_weights(), spatial.get_weights()) == 0
    h_spatial = spatial.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    h_plain = plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    assert max_difference(plain.get_weights(), spatial.get_weights()) < 1e-10
    np.testing.assert_allclose(
        h_spatial.history["loss"], h_plain.history["loss"], rtol=1e-10
    )
    assert max_difference(plain.get_weights(), conv_net(batch_norm).get_weights()) > 0


@pytest.mark.slow(
    reason="covered in the default run by: "
    "test_five_fit_steps_give_the_weights_of_one_device"
)
def test_five_float32_fit_steps_stay_within_1e_5_of_one_device(strategies):
    # float32: the tiles sum in another order than the whole image, so the
    # weights agree to float32 rounding, not bit for bit.
    x, y = data()
    plain = compile_sgd(conv_net("sync_all"))
    spatial = kr.spatial.partition(plain, 2, strategy=strategies[4])
    spatial.fit(x.astype("float32"), y, batch_size=BATCH, shuffle=False, verbose=0)
    plain.fit(x.astype("float32"), y, batch_size=BATCH, shuffle=False, verbose=0)
    assert spatial.get_weights()[0].dtype == np.float32
    assert max_difference(plain.get_weights(), spatial.get_weights()) < 1e-5


@pytest.mark.parametrize(
    "mixed",
    [
        "mixed_float16",
        pytest.param(
            "mixed_bfloat16",
            marks=pytest.mark.slow(
                reason="covered in the default run by: the same test [mixed_float16]"
            ),
        ),
    ],
)
def test_mixed_precision_layers_train_on_the_plain_path(strategies, mixed):
    # Mixed precision: the halo layers keep their extended tile (Keras casts
    # variables only inside `__call__`, see `_recompute`); a step must still run
    # (bfloat16 halo rows travel as float32: gathers have no bfloat16 kernel) and
    # track one device to 16-bit rounding.
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(mixed)
    try:
        x, y = data(BATCH)
        plain = compile_sgd(conv_net("sync_all"))
        spatial = kr.spatial.partition(plain, 2, strategy=strategies[2])
        spatial.fit(x.astype("float32"), y, batch_size=BATCH, shuffle=False, verbose=0)
        plain.fit(x.astype("float32"), y, batch_size=BATCH, shuffle=False, verbose=0)
    finally:
        keras.config.set_dtype_policy(policy)
    assert spatial.layers[1].compute_dtype == mixed.split("_")[1]
    assert max_difference(plain.get_weights(), spatial.get_weights()) < 2e-2


@pytest.mark.slow
def test_evaluate_and_predict_take_whole_images(float64, strategies):
    x, y = data(16)
    plain = compile_sgd(conv_net())
    spatial = kr.spatial.partition(plain, 2, strategy=strategies[4])
    np.testing.assert_allclose(
        spatial.predict(x, batch_size=8, verbose=0),
        plain.predict(x, batch_size=8, verbose=0),
        atol=1e-12,
    )
    np.testing.assert_allclose(
        spatial.evaluate(x, y, batch_size=8, verbose=0),
        plain.evaluate(x, y, batch_size=8, verbose=0),
        rtol=1e-12,
    )


@pytest.mark.slow(
    reason="covered in the default run by: spatial/test_unet.py (a segmentation map, "
    "tiled and stitched)"
)
def test_image_shaped_outputs_are_tiled_and_stitched(float64, strategies):
    keras.utils.set_random_seed(2)
    inputs = keras.Input((HEIGHT, WIDTH, 2))
    x = keras.layers.Conv2D(4, 3, strides=2, padding="same", activation="relu")(inputs)
    outputs = keras.layers.Conv2D(3, 3, padding="same")(x)
    plain = compile_sgd(keras.Model(inputs, outputs))
    spatial = kr.spatial.partition(plain, 2, strategy=strategies[4])
    images, _ = data(16)
    labels = np.random.default_rng(3).integers(0, 3, size=(16, HEIGHT // 2, WIDTH // 2))
    np.testing.assert_allclose(
        spatial.predict(images, batch_size=8, verbose=0),
        plain.predict(images, batch_size=8, verbose=0),
        atol=1e-12,
    )
    spatial.fit(images, labels, batch_size=8, shuffle=False, verbose=0)
    plain.fit(images, labels, batch_size=8, shuffle=False, verbose=0)
    assert max_difference(plain.get_weights(), spatial.get_weights()) < 1e-10


def test_errors_name_the_layer_or_the_height(strategies):
    inputs = keras.Input((12, 4, 1))
    flat = keras.Model(inputs, keras.layers.Flatten(name="flat")(inputs))
    with pytest.raises(ValueError, match="`flat`.*cannot be partitioned"):
        kr.spatial.partition(flat, 2, strategy=strategies[2])
    strided = keras.Sequential(
        [keras.Input((12, 4, 1)), keras.layers.Conv2D(1, 3, strides=4, name="s4")]
    )
    with pytest.raises(ValueError, match="`s4`.*split into `parts`=2"):
        kr.spatial.partition(strided, 2, strategy=strategies[2])
    short = keras.Sequential([keras.Input((10, 4, 1)), keras.layers.Conv2D(1, 3)])
    with pytest.raises(ValueError, match="input height 10.*divisible"):
        kr.spatial.partition(short, 4, strategy=strategies[4])
    with pytest.raises(ValueError, match="must divide the 2 replicas"):
        kr.spatial.partition(strided, 4, strategy=strategies[2])
    with pytest.raises(ValueError, match="axis"):
        kr.spatial.partition(strided, 2, axis="width", strategy=strategies[2])


def test_a_sequential_model_trains_in_a_dataset(float64, strategies):
    model = keras.Sequential(
        [
            keras.Input((HEIGHT, WIDTH, 2)),
            keras.layers.Conv2D(3, 5, padding="same", activation="tanh"),
            keras.layers.MaxPooling2D(3, strides=2, padding="same"),
            keras.layers.GlobalMaxPooling2D(),
            keras.layers.Dense(3),
        ]
    )
    plain = compile_sgd(model)
    spatial = kr.spatial.partition(plain, 2, strategy=strategies[2])
    x, y = data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    spatial.fit(dataset, verbose=0)
    plain.fit(dataset, verbose=0)
    assert max_difference(plain.get_weights(), spatial.get_weights()) < 1e-10


@pytest.mark.slow
@pytest.mark.parametrize("replicas,parts", [(2, 2), (4, 2)])
def test_small_resnet_trains_like_one_device(float64, strategies, replicas, parts):
    keras.utils.set_random_seed(4)
    plain = compile_sgd(kr.models.small_resnet((16, 16, 1), 3, widths=(4, 8, 8)))
    spatial = kr.spatial.partition(plain, parts, strategy=strategies[replicas])
    rng = np.random.default_rng(5)
    x = rng.normal(size=(STEPS * BATCH, 16, 16, 1))
    y = rng.integers(0, 3, size=STEPS * BATCH)
    spatial.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    assert max_difference(plain.get_weights(), spatial.get_weights()) < 1e-10


@pytest.mark.slow
def test_batch_norm_groups_compose_with_data_parallel_groups(float64, strategies):
    # Plain BatchNormalization on 2 data-parallel replicas normalises each
    # replica's images; partitioned 2 x 2, each group's: the same statistics, so
    # the same trainable weights. (The moving statistics differ by design: Keras'
    # plain layer does not average them over replicas, SyncBatchNormalization
    # does.)
    x, y = data()
    with strategies[2].scope():
        data_parallel = compile_sgd(conv_net("plain"))
    spatial = kr.spatial.partition(
        compile_sgd(conv_net("plain")), 2, strategy=strategies[4]
    )
    data_parallel.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    spatial.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    trained = [
        [v.numpy() for v in m.trainable_weights] for m in (data_parallel, spatial)
    ]
    assert max_difference(*trained) < 1e-10
