"""A finished backup is deleted so that a kill at any moment leaves a clean state.

Issue 49, item 12: a kill during the end-of-run `rmtree` left a backup the next
start refused, or `latest.weights.h5` alone, resumed as if nothing had trained.
Here the deletion is stopped at each of its unlinks in turn (an exception
raised from `os.unlink` / `os.rmdir`, as a kill would stop it), and a new
`fit` must then either resume the finished backup or start from scratch.
"""

import os
import shutil

import keras
import numpy as np

from keras_replicator._files import backup as engine
from keras_replicator.testing import _workloads

EPOCHS = 2


class Killed(BaseException):
    """A kill, as the deletion sees it: nothing after it runs."""


class FirstWeights(keras.callbacks.Callback):
    """Records the epochs that ran and the weights training started from."""

    def on_train_begin(self, logs=None):
        self.start, self.epochs = self.model.get_weights(), []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


def _fit(model, backup, *callbacks):
    x, y = _workloads.classification_data(64)
    backup_callback = engine.AtomicBackupAndRestore(
        backup, double_checkpoint=True, delete_checkpoint=False
    )
    model.fit(
        x,
        y,
        batch_size=32,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[backup_callback, *callbacks],
    )
    return backup_callback


def _same(a, b):
    return all(np.array_equal(left, right) for left, right in zip(a, b))


def _killed_at(monkeypatch, call):
    """os.unlink / os.rmdir that raise `Killed` on their `call`-th use together."""
    calls = [0]
    real = {"unlink": os.unlink, "rmdir": os.rmdir}

    def counted(name):
        def function(*args, **kwargs):
            calls[0] += 1
            if calls[0] == call:
                raise Killed
            return real[name](*args, **kwargs)

        return function

    for name in real:
        monkeypatch.setattr(os, name, counted(name))
    return calls


def test_a_kill_at_any_point_of_the_deletion_leaves_a_resumable_or_no_backup(
    tmp_path, monkeypatch
):
    initial = _workloads.mlp().get_weights()
    template = str(tmp_path / "finished")
    trained = _workloads.mlp()
    trained.set_weights(initial)
    finisher = _fit(trained, template)
    final = trained.get_weights()
    backup = str(tmp_path / "backup")
    outcomes, call = [], 1
    while True:
        shutil.copytree(template, backup)
        finisher.delete_checkpoint, finisher.backup_dir = True, backup
        with monkeypatch.context() as patch:
            calls = _killed_at(patch, call)
            try:
                finisher.on_train_end()
                done = True
            except Killed:
                done = False
        model, seen = _workloads.mlp(), FirstWeights()
        model.set_weights(initial)
        try:
            _fit(model, backup, seen)
        except Exception as error:  # noqa: BLE001 (the outcome under test)
            outcomes.append((call, f"refused: {error}"[:200]))
        else:
            resumed = seen.epochs == [] and _same(seen.start, final)
            fresh = seen.epochs == list(range(EPOCHS)) and _same(seen.start, initial)
            if not (resumed or fresh):
                outcomes.append(
                    (
                        call,
                        f"epochs {seen.epochs}, from the final weights"
                        if _same(seen.start, final)
                        else f"epochs {seen.epochs}",
                    )
                )
        shutil.rmtree(backup, ignore_errors=True)
        if done:
            break
        call += 1
    assert calls[0] > 3, "the deletion was not interrupted at each step"
    assert outcomes == []
