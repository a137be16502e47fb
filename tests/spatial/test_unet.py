"""keras-io's U-Net-like segmentation model, partitioned, trains like one device.

`unet` is the model of keras-io's "Image segmentation with a U-Net-like
architecture" (oxford_pets_image_segmentation.py, fchollet) as its authors wrote
it, with the image size and filter counts shrunk so it runs in seconds: an entry
`Conv2D` with stride 2, three blocks of `SeparableConv2D` / `BatchNormalization` /
`MaxPooling2D` with strided 1x1 residual projections, four blocks of
`Conv2DTranspose` / `UpSampling2D` with upsampled residuals, `layers.add`, and a
per-pixel softmax `Conv2D`.
"""

import keras
import numpy as np
import pytest
from keras import layers

import keras_replicator as kr
from tests.spatial.test_partition import max_difference

CLASSES, STEPS, BATCH = 3, 3, 4


def unet(img_size, num_classes, entry=4, down=(4, 8, 8), up=(8, 8, 4, 4), **upsample):
    """keras-io's `get_model`, with `entry` / `down` / `up` filter counts."""
    inputs = keras.Input(shape=img_size + (3,))
    x = layers.Conv2D(entry, 3, strides=2, padding="same")(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    previous_block_activation = x
    for filters in down:
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        residual = layers.Conv2D(filters, 1, strides=2, padding="same")(
            previous_block_activation
        )
        x = layers.add([x, residual])
        previous_block_activation = x
    for filters in up:
        x = layers.Activation("relu")(x)
        x = layers.Conv2DTranspose(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.Conv2DTranspose(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.UpSampling2D(2, **upsample)(x)
        residual = layers.UpSampling2D(2, **upsample)(previous_block_activation)
        residual = layers.Conv2D(filters, 1, padding="same")(residual)
        x = layers.add([x, residual])
        previous_block_activation = x
    outputs = layers.Conv2D(num_classes, 3, activation="softmax", padding="same")(x)
    return keras.Model(inputs, outputs)


def _data(height, width, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(STEPS * BATCH, height, width, 3))
    masks = rng.integers(0, CLASSES, size=(STEPS * BATCH, height, width, 1))
    return images, masks


def _compiled(model, learning_rate=0.1):
    # keras-io compiles with rmsprop; SGD with momentum checks the reduction.
    model.compile(
        keras.optimizers.SGD(learning_rate, momentum=0.5),
        "sparse_categorical_crossentropy",
    )
    return model


def check_unet(strategy, parts, height, width=16, learning_rate=0.1, **upsample):
    keras.utils.set_random_seed(7)
    plain = _compiled(unet((height, width), CLASSES, **upsample), learning_rate)
    spatial = kr.spatial.partition(plain, parts, strategy=strategy)
    images, masks = _data(height, width)
    initial = plain.get_weights()
    forward = np.max(
        np.abs(
            spatial.predict(images, batch_size=BATCH, verbose=0)
            - plain.predict(images, batch_size=BATCH, verbose=0)
        )
    )
    h_spatial = spatial.fit(images, masks, batch_size=BATCH, shuffle=False, verbose=0)
    h_plain = plain.fit(images, masks, batch_size=BATCH, shuffle=False, verbose=0)
    weights = max_difference(plain.get_weights(), spatial.get_weights())
    np.testing.assert_allclose(
        h_spatial.history["loss"], h_plain.history["loss"], rtol=1e-10
    )
    assert max_difference(plain.get_weights(), initial) > 1e-3  # it trained
    return forward, weights


def test_unet_partitioned_in_2_predicts_and_trains_like_one_device(float64, strategies):
    # One downsampling block and two upsampling ones: every layer kind of the
    # example, in seconds.
    forward, weights = check_unet(strategies[2], 2, 32, down=(4,), up=(4, 4))
    assert forward < 1e-12 and weights < 1e-10, (forward, weights)


WIDTHS = {
    # The test's narrow filters; 0.1 drives the softmax below Keras' epsilon
    # (1e-7) within 3 steps, where the loss from the logits and the loss from
    # clipped probabilities differ: before the halo layers applied their
    # activation last, the first epoch's loss differed by 0.34 and the weights
    # by 0.67 (issue 53).
    "narrow": {"learning_rate": 0.1},
    # keras-io's filter counts (0.1 diverges at these widths: weights ~1e7).
    "keras_io": {
        "entry": 32,
        "down": (64, 128, 256),
        "up": (256, 128, 64, 32),
        "learning_rate": 1e-3,
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("widths", sorted(WIDTHS))
def test_full_depth_unet_trains_like_one_device(float64, strategies, widths):
    # 3 down and 4 up blocks on 32 x 16 images: the deepest tiles hold 1 row.
    forward, weights = check_unet(strategies[2], 2, 32, **WIDTHS[widths])
    assert forward < 1e-12 and weights < 1e-10, (forward, weights)


FINAL_LAYERS = {
    "conv": lambda: layers.Conv2D(3, 3, padding="same", activation="softmax"),
    "separable": lambda: layers.SeparableConv2D(
        3, 3, padding="same", activation="softmax"
    ),
    "transposed": lambda: layers.Conv2DTranspose(
        3, 3, strides=2, padding="same", activation="softmax"
    ),
}


# Every halo layer keeps its activation the same way (`spatial/_tiled.py`).
_SAME_AS_CONV = pytest.mark.slow(
    reason="covered in the default run by: the same test [conv] (the activation "
    "is applied last by the shared `_tiled` base of every halo layer)"
)


@pytest.mark.parametrize(
    "final",
    [
        "conv",
        pytest.param("separable", marks=_SAME_AS_CONV),
        pytest.param("transposed", marks=_SAME_AS_CONV),
    ],
)
def test_a_saturated_softmax_output_gives_the_loss_from_its_logits(
    float64, strategies, final
):
    # Keras' crossentropy takes the logits of a softmax output (and clips the
    # probabilities of anything else to [1e-7, 1 - 1e-7]). Logits 50 apart make
    # every wrong class's probability ~1e-22: clipped, the loss and gradient
    # would be another function's.
    keras.utils.set_random_seed(3)
    inputs = keras.Input((8, 6, 2))
    x = layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    x = layers.Rescaling(50.0)(x)
    outputs = FINAL_LAYERS[final]()(x)
    plain = _compiled(keras.Model(inputs, outputs))
    spatial = kr.spatial.partition(plain, 2, strategy=strategies[2])
    rng = np.random.default_rng(0)
    images = rng.normal(size=(STEPS * BATCH, 8, 6, 2))
    rows = 16 if final == "transposed" else 8
    columns = 12 if final == "transposed" else 6
    masks = rng.integers(0, CLASSES, size=(STEPS * BATCH, rows, columns, 1))
    probabilities = plain.predict(images, verbose=0)
    assert (probabilities < 1e-7).mean() > 0.1  # saturated: clipping would bite
    h_spatial = spatial.fit(images, masks, batch_size=BATCH, shuffle=False, verbose=0)
    h_plain = plain.fit(images, masks, batch_size=BATCH, shuffle=False, verbose=0)
    np.testing.assert_allclose(
        h_spatial.history["loss"], h_plain.history["loss"], rtol=1e-10
    )
    assert max_difference(plain.get_weights(), spatial.get_weights()) < 1e-10
    # The layer reports and saves the user's activation.
    halo = spatial.layers[-1]
    assert halo.get_config()["activation"] == "softmax"


@pytest.mark.slow
@pytest.mark.parametrize(
    "replicas,parts,height,interpolation",
    [(4, 4, 32, "nearest"), (2, 2, 32, "bilinear")],
)
def test_unet_other_layouts_and_bilinear_upsampling(
    float64, strategies, replicas, parts, height, interpolation
):
    forward, weights = check_unet(
        strategies[replicas],
        parts,
        height,
        down=(4,),
        up=(4, 4),
        interpolation=interpolation,
    )
    assert forward < 1e-12 and weights < 1e-10, (forward, weights)
