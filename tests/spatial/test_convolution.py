"""Halo convolutions equal the whole-image layer in float64, forward and backward."""

import keras
import numpy as np
import pytest

import keras_replicator as kr
from keras_replicator.spatial import _geometry
from tests.spatial import _tiles

# (Keras class name, keyword arguments)
CASES = [
    ("Conv2D", dict(filters=4, kernel_size=3, padding="same")),
    ("Conv2D", dict(filters=4, kernel_size=3, strides=2, padding="same")),
    ("Conv2D", dict(filters=4, kernel_size=4, strides=2, padding="same")),
    ("Conv2D", dict(filters=4, kernel_size=1, strides=2, padding="same")),
    ("Conv2D", dict(filters=4, kernel_size=3, padding="valid")),
    ("Conv2D", dict(filters=4, kernel_size=3, strides=2, padding="valid")),
    ("Conv2D", dict(filters=4, kernel_size=5, padding="valid")),
    ("Conv2D", dict(filters=4, kernel_size=3, dilation_rate=2, padding="same")),
    ("Conv2D", dict(filters=4, kernel_size=(5, 2), padding="valid", activation="tanh")),
    ("DepthwiseConv2D", dict(kernel_size=3, strides=2, padding="same")),
    ("DepthwiseConv2D", dict(kernel_size=3, dilation_rate=2, padding="valid")),
    ("SeparableConv2D", dict(filters=4, kernel_size=3, strides=2, padding="same")),
    ("SeparableConv2D", dict(filters=4, kernel_size=3, dilation_rate=2)),
]


def _window(kwargs):
    k = kwargs["kernel_size"]
    k = k[0] if isinstance(k, tuple) else k
    d = kwargs.get("dilation_rate", 1)
    return _geometry.Window(
        d * (k - 1) + 1, kwargs.get("strides", 1), kwargs.get("padding", "valid")
    )


def check_layer(strategies, name, kwargs, replicas, parts, halo_cls, **extra):
    height = _tiles.pick_height(_window(kwargs), parts)
    groups = replicas // parts
    rng = np.random.default_rng(0)
    x = rng.normal(size=(groups * _tiles.IMAGES_PER_GROUP, height, _tiles.WIDTH, 3))
    plain = getattr(keras.layers, name)(dtype="float64", **kwargs, **extra)
    plain.build(x.shape)
    for v in plain.weights:
        v.assign(rng.normal(size=v.shape))
    upstream = rng.normal(size=plain.compute_output_shape(x.shape))
    out, dx, dw = _tiles.reference(plain, x, upstream)
    strategy = strategies[replicas]
    with strategy.scope():
        halo = halo_cls(dtype="float64", parts=parts, **kwargs, **extra)
        halo.build((None, height // parts) + x.shape[2:])
        halo.set_weights(plain.get_weights())
    t_out, t_dx, t_dw = _tiles.run_tiles(strategy, halo, x, upstream, parts)
    return out, dx, dw, t_out, t_dx, t_dw, groups


@pytest.mark.parametrize("replicas,parts", _tiles.LAYOUTS)
@pytest.mark.parametrize("name,kwargs", CASES, ids=lambda c: str(c))
def test_forward_and_gradients_equal_the_whole_image(
    strategies, name, kwargs, replicas, parts
):
    halo_cls = getattr(kr.spatial, "Halo" + name)
    out, dx, dw, t_out, t_dx, t_dw, groups = check_layer(
        strategies, name, kwargs, replicas, parts, halo_cls
    )
    np.testing.assert_allclose(_tiles.stitch(t_out, groups, parts), out, atol=1e-12)
    np.testing.assert_allclose(_tiles.stitch(t_dx, groups, parts), dx, atol=1e-12)
    for reference, per_replica in zip(dw, t_dw):
        np.testing.assert_allclose(np.sum(per_replica, axis=0), reference, atol=1e-12)


def test_window_wider_than_a_tile_names_the_layer():
    with pytest.raises(ValueError, match="`wide`.*at least as high"):
        _geometry.halo(_geometry.Window(9, 1, "same"), 2, 4, "wide")


def test_height_not_divisible_names_the_layer_and_parts():
    with pytest.raises(ValueError, match="`c`.*7 output rows.*parts`=2"):
        _geometry.halo(_geometry.Window(3, 2, "same"), 7, 2, "c")


def test_config_round_trips_with_the_users_padding():
    layer = kr.spatial.HaloConv2D(2, 3, padding="same", parts=4)
    config = layer.get_config()
    assert config["padding"] == "same" and config["parts"] == 4
    clone = kr.spatial.HaloConv2D.from_config(config)
    assert clone.tile_padding == "same" and clone.padding == "valid"
