"""Sharded optimizer state is saved whole and loads anywhere (issue 24).

Every format Keras and TensorFlow write (`.keras`, `.weights.h5`,
`BackupAndRestore`, `tf.train.Checkpoint`) must hold what an unsharded run
writes, and continue exactly on another replica count or on one device.
"""

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.sharding import _training as t


# One device sums the global-batch gradient in another order than 2 replicas;
# Adam's division by sqrt(v) amplifies the last bit (1.0e-10 measured after 10
# steps). Same replica count, sharded or not: 1e-12.
def _tolerance(replicas):
    return 1e-9 if replicas == 1 else 1e-12


def _adam():
    return keras.optimizers.Adam(0.01)


def _leaves(path):
    found = {}
    with h5py.File(path) as f:
        f.visititems(
            lambda name, obj: (
                found.__setitem__(name, obj[()])
                if isinstance(obj, h5py.Dataset)
                else None
            )
        )
    return found


def test_a_sharded_weights_file_is_the_unsharded_runs_file(tmp_path):
    paths = []
    for shard in (False, True):
        model = t.fit(t.model_in(t.strategy(2, shard), _adam), epochs=1)
        paths.append(str(tmp_path / f"{shard}.weights.h5"))
        model.save_weights(paths[-1])
    plain, sharded = (_leaves(p) for p in paths)
    assert sorted(plain) == sorted(sharded)
    for name in plain:
        np.testing.assert_array_equal(np.asarray(sharded[name]), plain[name])


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """2 sharded replicas: a `.keras` file and a checkpoint after epoch 1, and
    the weights after epoch 2."""
    directory = tmp_path_factory.mktemp("sharded")
    model = t.fit(t.model_in(t.strategy(2, True), _adam), epochs=1)
    model.save(str(directory / "model.keras"))
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    prefix = checkpoint.save(str(directory / "checkpoint"))
    t.fit(model, epochs=1)
    return {
        "keras": str(directory / "model.keras"),
        "checkpoint": prefix,
        "weights": t.weights(model),
    }


@pytest.mark.parametrize(
    "replicas, shard",
    [
        (1, False),
        pytest.param(
            4,
            True,
            marks=pytest.mark.slow(
                reason="covered in the default run by: the same test [1-False], "
                "[2-False]"
            ),
        ),
        (2, False),
    ],
)
def test_a_keras_file_continues_anywhere(sharded_run, replicas, shard):
    strategy = t.strategy(replicas, shard)
    floatx = keras.config.floatx()
    keras.config.set_floatx("float64")  # the loss takes floatx when loaded
    try:
        with strategy.scope():
            model = keras.models.load_model(sharded_run["keras"])
    finally:
        keras.config.set_floatx(floatx)
    t.fit(model, epochs=1)
    difference = t.max_difference(t.weights(model), sharded_run["weights"])
    assert difference <= _tolerance(replicas)


@pytest.mark.parametrize("replicas, shard", [(1, False), (4, True)])
def test_a_tf_checkpoint_continues_anywhere(sharded_run, replicas, shard):
    strategy = t.strategy(replicas, shard)
    model = t.model_in(strategy, _adam)
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    checkpoint.restore(sharded_run["checkpoint"]).assert_existing_objects_matched()
    t.fit(model, epochs=1)
    difference = t.max_difference(t.weights(model), sharded_run["weights"])
    assert difference <= _tolerance(replicas)


def test_backup_and_restore_resumes_an_interrupted_sharded_run(tmp_path):
    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                raise RuntimeError("interrupted")

    backup = str(tmp_path / "backup")
    x, y = t.data()
    model = t.model_in(t.strategy(2, True), _adam)
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(
            x,
            y,
            batch_size=t.BATCH,
            epochs=2,
            shuffle=False,
            verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(backup), Interrupt()],
        )
    resumed = t.model_in(t.strategy(2, True), _adam)
    history = resumed.fit(
        x,
        y,
        batch_size=t.BATCH,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[keras.callbacks.BackupAndRestore(backup)],
    )
    uninterrupted = t.fit(t.model_in(t.strategy(2, True), _adam))
    assert t.max_difference(t.weights(resumed), t.weights(uninterrupted)) <= 1e-12
    assert history.epoch == [1]  # epoch 0 was restored, not rerun


def test_a_checkpoint_restored_before_the_first_step_is_cut_into_pieces(sharded_run):
    """TensorFlow defers the restore of slots that do not exist yet."""
    strategy = t.strategy(4, True)
    model = t.model_in(strategy, _adam)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    checkpoint.restore(sharded_run["checkpoint"])
    t.fit(model, epochs=1)  # builds the optimizer: deferred restores fire
    assert t.max_difference(t.weights(model), sharded_run["weights"]) <= 1e-12
