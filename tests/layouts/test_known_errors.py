"""A model shape DTensor trains wrong without an error gets a warning (`_known_errors`).

A Dense split by its input rows right after a `Concatenate` trains wrong on the
mesh (the conformance row `string_dict_inputs` keeps the measured error as a
strict expected failure); split by columns it is exact. The strategy warns,
naming the layer, before the first step of such a model, and only of it.
"""

import warnings

import keras
import numpy as np
import pytest

import keras_replicator as kr


def concatenated_model():
    a, b = keras.Input((4,), name="a"), keras.Input((4,), name="b")
    joined = keras.layers.Concatenate(name="joined")([a, b])
    hidden = keras.layers.Dense(8, name="after_join")(joined)
    model = keras.Model({"a": a, "b": b}, keras.layers.Dense(3, name="out")(hidden))
    model.compile(optimizer="sgd", loss="mse")
    return model


def fit(kernel_axes):
    mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"], kr.devices(4))
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[".*after_join/kernel"] = kernel_axes
    strategy = kr.ModelParallelReplicator(layout_map)
    with strategy.scope():
        model = concatenated_model()
    x = {"a": np.ones((8, 4)), "b": np.ones((8, 4))}
    model.fit(x, np.ones((8, 3)), batch_size=8, epochs=2, verbose=0)


def test_a_row_split_after_a_concatenation_warns_once_naming_it():
    with pytest.warns(UserWarning, match=r"\['after_join \(after joined\)'\]") as seen:
        fit(("model", None))
    assert sum("Concatenate" in str(w.message) for w in seen) == 1


def test_a_column_split_after_a_concatenation_does_not_warn():
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*Concatenate.*")
        fit((None, "model"))
