"""LayoutPlan: the LayoutMap's layout, else the slot's weight's, else replicated."""

import keras
import pytest

import keras_replicator as kr
from keras_replicator.layouts._mesh import backend_mesh
from keras_replicator.layouts._plan import LayoutPlan


def plan(**entries):
    device_mesh = keras.distribution.DeviceMesh(
        (2, 2), ["batch", "model"], kr.devices(4)
    )
    layout_map = keras.distribution.LayoutMap(device_mesh)
    for key, axes in entries.items():
        layout_map[key.replace("__", "/")] = axes
    return LayoutPlan(layout_map, backend_mesh(device_mesh))


def test_exact_key_then_the_one_fullmatching_regex():
    layouts = plan(**{"dense__kernel": (None, "model"), ".*__bias": ("model",)})
    assert layouts.layout_for("dense/kernel", (4, 6)).sharding_specs == [
        "unsharded",
        "model",
    ]
    assert layouts.layout_for("block_0/dense/bias", (6,)).sharding_specs == ["model"]
    # fullmatch: a key is not found inside a longer path.
    assert layouts.layout_for("outer/dense/kernel", (4, 6)).sharding_specs == [
        "unsharded",
        "unsharded",
    ]
    assert layouts.unmatched_keys() == []


def test_an_optimizer_slot_takes_its_weights_layout():
    layouts = plan(**{".*__kernel": ("model", "batch")})
    layouts.layout_for("model/dense/kernel", (4, 6))
    slot = layouts.layout_for("adam/model_dense_kernel_momentum", (4, 6))
    assert slot.sharding_specs == ["model", "batch"]
    # A same-named variable of another shape is not a slot of it.
    other = layouts.layout_for("adam/model_dense_kernel_extra", (6,))
    assert other.sharding_specs == ["unsharded"]


def test_keys_that_matched_nothing_are_listed():
    layouts = plan(**{"a__kernel": (None, "model"), "b__kernel": (None, "model")})
    layouts.layout_for("a/kernel", (2, 2))
    assert layouts.unmatched_keys() == ["b/kernel"]


def test_two_matching_keys_a_wrong_rank_and_an_undivided_size_are_errors():
    layouts = plan(**{".*kernel": (None, "model"), "dense.*": (None, "model")})
    with pytest.raises(ValueError, match="matches several `LayoutMap` keys"):
        layouts.layout_for("dense/kernel", (2, 2))
    layouts = plan(**{"dense__kernel": (None, "model")})
    with pytest.raises(ValueError, match="has 2 axes but the variable"):
        layouts.layout_for("dense/kernel", (2, 2, 2))
    with pytest.raises(ValueError, match="3 is not a multiple of the 2 devices"):
        layouts.layout_for("dense/kernel", (2, 3))
