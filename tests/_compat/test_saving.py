"""`_compat/saving.py`: Keras' own TensorBoard on a non-chief worker."""

import os
import sys

import keras

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
