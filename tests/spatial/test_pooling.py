"""Halo and group-global pooling equal the whole-image layers in float64."""

import numpy as np
import pytest

import keras_replicator as kr
from keras_replicator.spatial import _geometry
from tests.spatial import _tiles
from tests.spatial.test_convolution import check_layer

CASES = [
    ("MaxPooling2D", dict(pool_size=3, strides=2, padding="same")),
    ("MaxPooling2D", dict(pool_size=2, padding="valid")),
    ("AveragePooling2D", dict(pool_size=3, strides=1, padding="same")),
    ("AveragePooling2D", dict(pool_size=3, strides=2, padding="same")),
    ("AveragePooling2D", dict(pool_size=(3, 2), strides=1, padding="valid")),
]


def _as_kernel(kwargs):
    pool = kwargs["pool_size"]
    kwargs = {k: v for k, v in kwargs.items() if k != "pool_size"}
    return {"kernel_size": pool, **kwargs}


@pytest.mark.parametrize("replicas,parts", _tiles.LAYOUTS)
@pytest.mark.parametrize("name,kwargs", CASES, ids=lambda c: str(c))
def test_windowed_pooling_equals_the_whole_image(
    strategies, name, kwargs, replicas, parts, monkeypatch
):
    # Pooling has no `kernel_size`; reuse the convolution harness's height picker.
    monkeypatch.setattr(
        "tests.spatial.test_convolution._window",
        lambda _: _window(kwargs),
    )
    halo_cls = getattr(kr.spatial, "Halo" + name)
    out, dx, _, t_out, t_dx, _, groups = check_layer(
        strategies, name, kwargs, replicas, parts, halo_cls
    )
    np.testing.assert_allclose(_tiles.stitch(t_out, groups, parts), out, atol=1e-12)
    np.testing.assert_allclose(_tiles.stitch(t_dx, groups, parts), dx, atol=1e-12)


def _window(kwargs):
    pool = kwargs["pool_size"]
    pool = pool[0] if isinstance(pool, tuple) else pool
    strides = kwargs.get("strides") or pool
    return _geometry.Window(pool, strides, kwargs["padding"])


@pytest.mark.parametrize("replicas,parts", _tiles.LAYOUTS)
@pytest.mark.parametrize("name", ["GlobalAveragePooling2D", "GlobalMaxPooling2D"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_global_pooling_is_a_group_reduction(
    strategies, name, replicas, parts, keepdims, monkeypatch
):
    monkeypatch.setattr(
        "tests.spatial.test_convolution._window",
        lambda _: _geometry.Window(1, 1, "valid"),
    )
    halo_cls = getattr(kr.spatial, "Group" + name)
    out, dx, _, t_out, t_dx, _, groups = check_layer(
        strategies, name, {}, replicas, parts, halo_cls, keepdims=keepdims
    )
    b = _tiles.IMAGES_PER_GROUP
    for r, value in enumerate(t_out):  # replicated within the group
        g = r // parts
        np.testing.assert_allclose(value, out[g * b : (g + 1) * b], atol=1e-12)
    # Every replica of a group backpropagates the same upstream: the whole-image
    # gradient of one copy is the sum over the group's copies divided by `parts`.
    np.testing.assert_allclose(
        _tiles.stitch(t_dx, groups, parts), parts * dx, atol=1e-12
    )
