"""`_compat/saving.py`: Keras' own TensorBoard, ModelCheckpoint and BackupAndRestore
routed per instance (a non-chief's TensorBoard, a checkpoint's writes)."""

import os
import sys

import keras
import pytest

import keras_replicator as kr
from keras_replicator.keras_integration._hooks import KerasHooks
from keras_replicator.testing import _workloads


def test_a_non_chief_tensorboard_scratch_is_removed_when_training_ends(
    tmp_path, monkeypatch
):
    # A non-chief's TensorBoard logs to a fresh scratch directory (one per
    # `set_model`, i.e. per fit); `on_train_end` deletes it. Without that patch
    # (lost once in a refactor) every fit leaves its event files in TMPDIR until
    # the process exits, and forever when the launcher kills it.
    kr.MultiDeviceReplicator(num_replicas=2)  # installs the Keras patches
    files = sys.modules[KerasHooks.remove_scratch.__module__]
    made = []

    def non_chief_log_dir(model, log_dir):
        made.append(files.scratch_dir(1))
        return made[-1]

    monkeypatch.setattr(
        KerasHooks, "log_dir_for_worker", staticmethod(non_chief_log_dir)
    )
    model = _workloads.mlp()
    x, y = _workloads.classification_data(32)
    board = keras.callbacks.TensorBoard(str(tmp_path / "logs"))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[board])
    assert made and board.log_dir == str(tmp_path / "logs")
    assert not os.path.exists(tmp_path / "logs")  # the chief's path is untouched
    assert not os.path.exists(made[0]), os.listdir(made[0])


def test_keras_callback_classes_are_left_alone():
    # Issue 50: the three stock callbacks are routed per instance, from the one
    # patch where a callback list meets its model; their classes stay Keras'.
    from keras_replicator._compat import _patching

    kr.MultiDeviceReplicator(num_replicas=2)  # installs the Keras patches
    for cls, name in (
        (keras.callbacks.ModelCheckpoint, "_save_model"),
        (keras.callbacks.BackupAndRestore, "on_epoch_end"),
        (keras.callbacks.TensorBoard, "set_model"),
        (keras.callbacks.TensorBoard, "on_train_end"),
    ):
        assert not _patching.is_replaced(cls, name), (cls, name)
    assert _patching.is_replaced(keras.callbacks.CallbackList, "set_model")


def test_a_routed_stock_checkpoint_writes_through_the_chief(tmp_path, monkeypatch):
    kr.MultiDeviceReplicator(num_replicas=2)
    written = []
    monkeypatch.setattr(KerasHooks, "routes_worker_files", staticmethod(bool))
    monkeypatch.setattr(
        KerasHooks,
        "save_checkpoint",
        staticmethod(lambda model, path, weights_only: written.append(path)),
    )
    model = _workloads.mlp()
    x, y = _workloads.classification_data(32)
    path = str(tmp_path / "ckpt" / "epoch-{epoch}.keras")
    checkpoint = keras.callbacks.ModelCheckpoint(path)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[checkpoint])
    assert written == [path.format(epoch=1), path.format(epoch=2)]
    assert not os.path.exists(tmp_path / "ckpt")  # no unguarded makedirs


def test_a_stock_checkpoint_outside_our_routing_saves_as_keras_does(tmp_path):
    kr.MultiDeviceReplicator(num_replicas=2)
    model = _workloads.mlp()
    x, y = _workloads.classification_data(32)
    path = tmp_path / "ckpt" / "model.weights.h5"
    checkpoint = keras.callbacks.ModelCheckpoint(str(path), save_weights_only=True)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[checkpoint])
    assert os.listdir(tmp_path / "ckpt") == ["model.weights.h5"]


def test_a_backup_subclass_overriding_some_events_is_refused_on_workers(
    tmp_path, monkeypatch
):
    kr.MultiDeviceReplicator(num_replicas=2)
    monkeypatch.setattr(KerasHooks, "routes_worker_files", staticmethod(bool))

    class Logged(keras.callbacks.BackupAndRestore):
        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)

    model = _workloads.mlp()
    x, y = _workloads.classification_data(32)
    backup = Logged(str(tmp_path / "backup"))
    with pytest.raises(ValueError, match=r"overrides some of its events \(on_epoch"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[backup])
    assert not os.path.exists(tmp_path / "backup")
