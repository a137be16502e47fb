"""ModelCheckpoint: the chief writes, atomically; the same path on every worker."""

import inspect
import os
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_replicator.callbacks import ModelCheckpoint
from keras_replicator.callbacks import model_checkpoint as module
from keras_replicator.launch import run_workers
from keras_replicator.testing import _workloads


def _fit(model, callbacks, epochs=2, **kwargs):
    x, y = _workloads.classification_data(64)
    return model.fit(
        x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=callbacks, **kwargs
    )


def test_is_the_keras_callback_with_the_same_arguments():
    assert issubclass(ModelCheckpoint, keras.callbacks.ModelCheckpoint)
    ours = inspect.signature(ModelCheckpoint.__init__)
    stock = inspect.signature(keras.callbacks.ModelCheckpoint.__init__)
    assert ours == stock


def test_the_keras_hooks_we_rely_on_still_exist():
    # If Keras renames these, our override would silently stop being called.
    for name in ("_save_model", "_get_file_path", "_should_save_model"):
        assert callable(getattr(keras.callbacks.ModelCheckpoint, name)), name
    params = inspect.signature(keras.callbacks.ModelCheckpoint._save_model)
    assert list(params.parameters) == ["self", "epoch", "batch", "logs"]


@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer")
def test_saves_each_epoch_without_leftovers(tmp_path):
    pattern = str(tmp_path / "ckpt-{epoch}.weights.h5")
    model = _workloads.mlp()
    _fit(model, [ModelCheckpoint(pattern, save_weights_only=True)])
    assert sorted(os.listdir(tmp_path)) == ["ckpt-1.weights.h5", "ckpt-2.weights.h5"]
    restored = _workloads.mlp()
    restored.load_weights(str(tmp_path / "ckpt-2.weights.h5"))
    for a, b in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_whole_model_and_save_best_only(tmp_path):
    path = str(tmp_path / "best.keras")
    model = _workloads.mlp()
    x, y = _workloads.classification_data(32, seed=1)
    checkpoint = ModelCheckpoint(path, monitor="val_loss", save_best_only=True)
    _fit(model, [checkpoint], epochs=3, validation_data=(x, y))
    assert os.listdir(tmp_path) == ["best.keras"]
    assert keras.models.load_model(path).count_params() == model.count_params()
    assert checkpoint.best is not None


def test_a_crash_while_saving_keeps_the_previous_file(tmp_path):
    path = str(tmp_path / "model.weights.h5")
    model = _workloads.mlp()
    _fit(model, [ModelCheckpoint(path, save_weights_only=True)], epochs=1)
    before = open(path, "rb").read()

    def dies_halfway(filepath, overwrite=True):
        with open(filepath, "wb") as file:
            file.write(before[: len(before) // 2])
        raise OSError("disk full halfway")

    model.save_weights = dies_halfway
    with pytest.raises(OSError, match="disk full halfway"):
        _fit(model, [ModelCheckpoint(path, save_weights_only=True)], epochs=1)
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["model.weights.h5"]


@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer")
def test_a_symlinked_filepath_updates_the_file_it_points_to(tmp_path):
    # Before: the link was replaced by a file and its target never updated.
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "run1.weights.h5"
    link = tmp_path / "latest.weights.h5"
    link.symlink_to(os.path.join("runs", "run1.weights.h5"))
    model = _workloads.mlp()
    _fit(model, [ModelCheckpoint(str(link), save_weights_only=True)], epochs=1)
    assert link.is_symlink() and os.listdir(tmp_path / "runs") == [target.name]
    restored = _workloads.mlp()
    restored.load_weights(str(target))
    for a, b in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_250_character_filepath_is_saved(tmp_path):
    # Before: ENAMETOOLONG, from the staging suffix added to a valid name.
    path = tmp_path / ("w" * 239 + ".weights.h5")
    assert len(path.name) == 250
    _fit(_workloads.mlp(), [ModelCheckpoint(str(path), save_weights_only=True)], 1)
    assert os.listdir(tmp_path) == [path.name]


def test_an_existing_directory_as_filepath_is_explained(tmp_path):
    (tmp_path / "model.keras").mkdir()
    with pytest.raises(IsADirectoryError, match="Received: filepath="):
        _fit(_workloads.mlp(), [ModelCheckpoint(str(tmp_path / "model.keras"))])


def test_chief_and_index_come_from_the_strategy():
    model = _workloads.mlp()
    assert module.is_chief(model)


SHARED_PATH_WORKER = textwrap.dedent(
    """
    import os, sys
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras_replicator as kr
    from keras_replicator.callbacks import BackupAndRestore, ModelCheckpoint
    from keras_replicator.testing import _workloads

    out = sys.argv[1]
    strategy = kr.MultiWorkerReplicator()
    with strategy.scope():
        model = _workloads.mlp()
    x, y = _workloads.classification_data(256)
    vx, vy = _workloads.classification_data(64, seed=1)
    callbacks = [
        ModelCheckpoint(os.path.join(out, "best.keras"), save_best_only=True),
        ModelCheckpoint(os.path.join(out, "w.weights.h5"), save_weights_only=True,
                        save_freq=2),
        BackupAndRestore(os.path.join(out, "backup"), double_checkpoint=True,
                         delete_checkpoint=False),
    ]
    model.fit(x, y, batch_size=64, epochs=3, validation_data=(vx, vy), verbose=0,
              callbacks=callbacks)
    print("TRAINED", kr.callbacks.model_checkpoint.is_chief(model))
    """
)


@pytest.mark.slow(
    reason="covered in the default run by: tests/_files/test_worker_files.py::"
    "test_keras_saving_on_two_workers_writes_each_path_once (ModelCheckpoint with "
    "save_best_only and weights at a save_freq, BackupAndRestore with "
    "double_checkpoint, on two workers sharing the paths)"
)
@pytest.mark.multi_worker
@pytest.mark.timeout(400)
def test_two_workers_share_one_path(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SHARED_PATH_WORKER)
    out = tmp_path / "out"
    result = run_workers(
        [sys.executable, str(script), str(out)], 2, timeout=300, echo=False
    )
    assert result.ok, result.describe_failure()
    assert "TRAINED True" in result.workers[0].output
    assert "TRAINED False" in result.workers[1].output
    assert sorted(os.listdir(out)) == ["backup", "best.keras", "w.weights.h5"]
    keras.models.load_model(str(out / "best.keras"))
    backup = sorted(os.listdir(out / "backup"))
    assert backup[-2:] == ["training_metadata.json", "training_metadata.json.bkp"]
    # The latest and the previous weights, and the latest for stock Keras.
    assert len(backup) == 5
