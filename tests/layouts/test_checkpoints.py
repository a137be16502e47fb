"""Checkpoints of a `ModelParallelReplicator` model hold whole weights (issue 52).

Proved here on a 2x2 mesh ("batch", "model") of 4 logical CPUs, a Megatron-split
MLP, float64, SGD with momentum (a momentum or iteration count left out of a
backup shows in the weights):

- `keras.callbacks.BackupAndRestore` (Keras' own: the library routes it to its
  atomic engine only under multi-worker Replicators) and
  `kr.callbacks.BackupAndRestore`: a `fit` stopped after epoch 2 of 4 and started
  again with the same `backup_dir` runs epochs 3 and 4 only and ends with an
  uninterrupted run's weights, momentums and iteration count, and one device's
  (1e-10).
- The backup's weights file, written on the mesh, restores into the model on one
  device and on a 4x1 mesh: same predictions and optimizer state (1e-12).
- A backup of another model is Keras' clear `ValueError` before any step; a
  mid-epoch backup resumes at the epoch's start, with a warning that says so.
- `tf.train.Checkpoint(model=..., optimizer=...)`: the file holds whole values;
  it restores on one device, on the same mesh and on a 4x1 mesh (also deferred:
  restored before the optimizer is built, then trained on, equals one device),
  and a one-device checkpoint restores on the mesh.
"""

import functools
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from tests.strategies.test_model_parallel import megatron_layout_map

TOLERANCE = 1e-10
EXACT = 1e-12  # a restore copies values: only the predictions' rounding differs
BATCH = 16

# Keras' own callback and ours. Ours listens for SIGTERM from `on_train_begin`
# to `on_train_end`, which a `fit` that raises never reaches: no signals here,
# so the test process keeps its own handler.
BACKUPS = {
    "keras": keras.callbacks.BackupAndRestore,
    "keras_replicator": functools.partial(
        kr.callbacks.BackupAndRestore, preemption_signals=()
    ),
}


class Interrupted(Exception):
    """What `InterruptAfter` raises: a crash between two epochs."""


class InterruptAfter(keras.callbacks.Callback):
    """Stops `fit` by raising after `epochs` epochs, as a crash would."""

    def __init__(self, epochs):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epochs:
            raise Interrupted(f"stopped after epoch {epoch + 1}")


def build(units=16):
    """The MLP with seeded weights, compiled with SGD and momentum."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(units, activation="relu", name="hidden"),
            keras.layers.Dense(4, name="logits"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def on_mesh(shape=(2, 2), build_optimizer=False, units=16):
    """The MLP built in a `ModelParallelReplicator` on a mesh of `shape`."""
    strategy = kr.ModelParallelReplicator(megatron_layout_map(shape))
    with strategy.scope():
        model = build(units)
        if build_optimizer:
            model.optimizer.build(model.trainable_variables)
    return model


def on_one_device():
    """The MLP on one device, its optimizer built (so it can be restored into)."""
    model = build()
    model.optimizer.build(model.trainable_variables)
    return model


def data():
    # 70 rows at batch 16: 5 steps an epoch, the last one of 6 rows.
    rng = np.random.default_rng(0)
    return rng.normal(size=(70, 8)), rng.integers(0, 4, 70)


def fit(model, epochs, callbacks=()):
    x, y = data()
    return model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=list(callbacks),
    )


def predict(model):
    return model.predict(data()[0], batch_size=BATCH, verbose=0)


def state(model):
    """Weights, momentums, iteration count and learning rate, whole."""
    return [np.asarray(v) for v in model.weights + model.optimizer.variables]


def max_gap(a, b):
    assert len(a) == len(b)
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def sharding(model, name):
    """The sharding specs the weight `name` ("hidden/kernel") is stored with."""
    (variable,) = [v for v in model.weights if v.path.endswith(name)]
    return model.distribute_strategy.layout_of(variable).sharding_specs


def interrupted_fit(backup_dir, backup_type=keras.callbacks.BackupAndRestore):
    """A 4-epoch `fit` on the 2x2 mesh, backed up and stopped after epoch 2."""
    model = on_mesh()
    with pytest.raises(Interrupted):
        fit(model, 4, [backup_type(backup_dir), InterruptAfter(2)])
    return model


@pytest.mark.parametrize("backup", BACKUPS)
def test_an_interrupted_fit_resumes_from_its_backup_as_if_never_stopped(
    float64, tmp_path, backup
):
    backup_type = BACKUPS[backup]
    backup_dir = str(tmp_path / "backup")
    interrupted_fit(backup_dir, backup_type)
    if backup == "keras":  # Keras' own files: the library left it alone
        assert sorted(os.listdir(backup_dir)) == [
            "latest.weights.h5",
            "training_metadata.json",
        ]
    resumed = on_mesh()
    history = fit(resumed, 4, [backup_type(backup_dir)])
    uninterrupted = on_mesh()
    fit(uninterrupted, 4)
    one_device = build()
    fit(one_device, 4)

    assert history.epoch == [2, 3]
    assert int(resumed.optimizer.iterations.numpy()) == 20
    assert max_gap(state(resumed), state(uninterrupted)) < TOLERANCE
    assert max_gap(state(resumed), state(one_device)) < TOLERANCE
    assert sharding(resumed, "hidden/kernel") == ["unsharded", "model"]


def test_the_backup_written_on_the_mesh_restores_on_one_device_and_a_4x1_mesh(
    float64, tmp_path
):
    backup_dir = str(tmp_path / "backup")
    model = interrupted_fit(backup_dir)
    weights = os.path.join(backup_dir, "latest.weights.h5")
    expected = predict(model)

    one_device = on_one_device()
    four_by_one = on_mesh((4, 1), build_optimizer=True)
    for restored in (one_device, four_by_one):
        restored.load_weights(weights)
        np.testing.assert_allclose(predict(restored), expected, rtol=0, atol=EXACT)
        assert max_gap(state(restored), state(model)) < EXACT
    assert sharding(four_by_one, "logits/kernel") == ["model", "unsharded"]


def test_a_backup_of_another_model_is_a_clear_error_before_any_step(float64, tmp_path):
    backup_dir = str(tmp_path / "backup")
    interrupted_fit(backup_dir)
    narrower = on_mesh(units=8)
    initial = [np.asarray(w) for w in narrower.weights]
    with pytest.raises(ValueError, match=r"variable.shape=\(8, 8\), Received"):
        fit(narrower, 4, [keras.callbacks.BackupAndRestore(backup_dir)])
    # Keras loads what fits (the iteration count) and raises: no step ran.
    assert max_gap([np.asarray(w) for w in narrower.weights], initial) == 0
    assert predict(narrower).shape == (70, 4)  # the mesh still works


def test_a_mid_epoch_backup_restarts_its_epoch_and_says_so(float64, tmp_path):
    # Resuming mid-epoch skips the batches trained on in the epoch iterator of
    # the data-parallel Replicators only; here the epoch starts over.
    backup_dir = str(tmp_path / "backup")

    class CrashAtBatch2(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise Interrupted("stopped at batch 2")

    def backup():
        return BACKUPS["keras_replicator"](backup_dir, save_freq=2)

    with pytest.raises(Interrupted):
        fit(on_mesh(), 2, [backup(), CrashAtBatch2()])
    resumed = on_mesh()
    with pytest.warns(UserWarning, match="the model's is ModelParallelReplicator"):
        fit(resumed, 2, [backup()])
    # Backed up after batch 1 (2 steps), then 2 whole epochs of 5 steps.
    assert int(resumed.optimizer.iterations.numpy()) == 12


def test_a_tf_train_checkpoint_of_the_mesh_holds_whole_values_and_restores_anywhere(
    float64, tmp_path
):
    model = on_mesh()
    fit(model, 1)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(
        str(tmp_path / "ckpt")
    )
    saved_shapes = {tuple(shape) for _, shape in tf.train.list_variables(path)}
    assert {tuple(w.shape) for w in model.weights} <= saved_shapes

    one_device, two_by_two = on_one_device(), on_mesh(build_optimizer=True)
    for restored in (one_device, two_by_two):
        checkpoint = tf.train.Checkpoint(model=restored, optimizer=restored.optimizer)
        checkpoint.restore(path).assert_existing_objects_matched()
        assert max_gap(state(restored), state(model)) < EXACT
    assert sharding(two_by_two, "hidden/kernel") == ["unsharded", "model"]

    # Restored before its optimizer exists (TensorFlow defers the slots), then
    # trained on: one device's two epochs.
    four_by_one = on_mesh((4, 1))
    checkpoint = tf.train.Checkpoint(model=four_by_one, optimizer=four_by_one.optimizer)
    status = checkpoint.restore(path)
    fit(four_by_one, 1)
    status.assert_consumed()
    reference = build()
    fit(reference, 2)
    assert max_gap(state(four_by_one), state(reference)) < TOLERANCE


def test_a_one_device_tf_train_checkpoint_restores_on_the_mesh(float64, tmp_path):
    one_device = build()
    fit(one_device, 1)
    path = tf.train.Checkpoint(model=one_device, optimizer=one_device.optimizer).save(
        str(tmp_path / "ckpt")
    )
    model = on_mesh(build_optimizer=True)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    checkpoint.restore(path).assert_existing_objects_matched()
    assert max_gap(state(model), state(one_device)) < EXACT
    np.testing.assert_allclose(predict(model), predict(one_device), rtol=0, atol=EXACT)
