"""Saving a partitioned model writes the model the user wrote; resuming is exact."""

import keras
import numpy as np
import pytest

import keras_replicator as kr
from tests.spatial.test_partition import (
    BATCH,
    compile_sgd,
    conv_net,
    data,
    max_difference,
)


@pytest.mark.slow  # ~20 s; the weights-file test below resumes in the default run
def test_save_load_and_continue_equals_an_uninterrupted_run(
    float64, strategies, tmp_path
):
    strategy = strategies[2]
    x, y = data(5 * BATCH)
    first, rest = (x[: 2 * BATCH], y[: 2 * BATCH]), (x[2 * BATCH :], y[2 * BATCH :])
    uninterrupted = compile_sgd(conv_net())
    uninterrupted.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)

    spatial = kr.spatial.partition(compile_sgd(conv_net()), 2, strategy=strategy)
    spatial.fit(*first, batch_size=BATCH, shuffle=False, verbose=0)
    spatial.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert not isinstance(loaded, kr.spatial.SpatialModel)
    assert max_difference(loaded.get_weights(), spatial.get_weights()) == 0
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), spatial.predict(x, verbose=0), atol=1e-12
    )

    # Momentum carries over: without the optimizer state the weights would differ.
    resumed = kr.spatial.partition(loaded, 2, strategy=strategy)
    resumed.fit(*rest, batch_size=BATCH, shuffle=False, verbose=0)
    assert max_difference(resumed.get_weights(), uninterrupted.get_weights()) < 1e-10
    fresh = kr.spatial.partition(compile_sgd(conv_net()), 2, strategy=strategy)
    fresh.set_weights(loaded.get_weights())
    fresh.fit(*rest, batch_size=BATCH, shuffle=False, verbose=0)
    assert max_difference(fresh.get_weights(), uninterrupted.get_weights()) > 1e-6


def test_weights_files_are_the_unpartitioned_models(float64, strategies, tmp_path):
    strategy = strategies[2]
    x, y = data(4 * BATCH)
    uninterrupted = compile_sgd(conv_net())
    uninterrupted.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    spatial = kr.spatial.partition(compile_sgd(conv_net()), 2, strategy=strategy)
    spatial.fit(
        x[: 2 * BATCH], y[: 2 * BATCH], batch_size=BATCH, shuffle=False, verbose=0
    )
    spatial.save_weights(tmp_path / "m.weights.h5")
    plain = conv_net(seed=7)
    plain.load_weights(tmp_path / "m.weights.h5")
    assert max_difference(plain.get_weights(), spatial.get_weights()) == 0

    # What BackupAndRestore does: load_weights into a fresh partitioned model, and
    # continue with the saved momentum.
    other = kr.spatial.partition(compile_sgd(conv_net(seed=8)), 2, strategy=strategy)
    other.load_weights(tmp_path / "m.weights.h5")
    assert max_difference(other.get_weights(), spatial.get_weights()) == 0
    other.fit(
        x[2 * BATCH :], y[2 * BATCH :], batch_size=BATCH, shuffle=False, verbose=0
    )
    assert max_difference(other.get_weights(), uninterrupted.get_weights()) < 1e-10


@pytest.mark.slow(
    reason="covered in the default run by: "
    "test_weights_files_are_the_unpartitioned_models"
)
def test_a_model_compiled_after_partition_saves_its_optimizer(
    float64, strategies, tmp_path
):
    # The original is not compiled: saving compiles it like the partitioned model,
    # so the momentum is saved and a ModelCheckpoint file resumes exactly.
    strategy = strategies[2]
    x, y = data(4 * BATCH)
    uninterrupted = compile_sgd(conv_net())
    uninterrupted.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    spatial = kr.spatial.partition(conv_net(), 2, strategy=strategy)
    with strategy.scope():
        compile_sgd(spatial)
    checkpoint = keras.callbacks.ModelCheckpoint(tmp_path / "m.keras")
    spatial.fit(
        x[: 2 * BATCH],
        y[: 2 * BATCH],
        batch_size=BATCH,
        shuffle=False,
        verbose=0,
        callbacks=[checkpoint],
    )
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert loaded.compiled and int(loaded.optimizer.iterations) == 2
    resumed = kr.spatial.partition(loaded, 2, strategy=strategy)
    resumed.fit(
        x[2 * BATCH :], y[2 * BATCH :], batch_size=BATCH, shuffle=False, verbose=0
    )
    assert max_difference(resumed.get_weights(), uninterrupted.get_weights()) < 1e-10


def test_a_spatial_model_built_directly_cannot_save(tmp_path):
    inputs = keras.Input((4, 4, 1))
    outputs = kr.spatial.GroupGlobalAveragePooling2D(parts=1)(inputs)
    model = kr.spatial.SpatialModel(inputs, outputs, parts=1, groups=1)
    with pytest.raises(ValueError, match="only `kr.spatial.partition` records"):
        model.save(tmp_path / "m.keras")
