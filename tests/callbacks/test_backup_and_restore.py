"""BackupAndRestore: atomic backups by the chief, exact resume, no torn state."""

import inspect
import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_replicator._files import backup as engine
from keras_replicator.callbacks import BackupAndRestore
from keras_replicator.callbacks import backup_and_restore as module
from keras_replicator.testing import _workloads

EPOCHS = 4


class Interrupt(keras.callbacks.Callback):
    """Stops training like a crash would, at the start of `epoch`."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("interrupted")


def _fit(model, callbacks, epochs=EPOCHS):
    x, y = _workloads.classification_data(128)
    return model.fit(
        x,
        y,
        batch_size=32,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )


def _model(initial):
    model = _workloads.mlp()
    model.set_weights(initial)
    return model


def _assert_weights_equal(a, b, atol=1e-6):
    for left, right in zip(a, b):
        np.testing.assert_allclose(left, right, atol=atol, rtol=0)


@pytest.fixture
def initial():
    return _workloads.mlp().get_weights()


@pytest.fixture
def uninterrupted(initial):
    model = _model(initial)
    _fit(model, [])
    return model.get_weights()


def test_is_the_keras_callback_with_its_arguments_and_keyword_only_extras():
    assert issubclass(BackupAndRestore, keras.callbacks.BackupAndRestore)
    ours = list(inspect.signature(BackupAndRestore.__init__).parameters.values())
    keras_own = inspect.signature(keras.callbacks.BackupAndRestore.__init__)
    assert ours[: len(keras_own.parameters)] == list(keras_own.parameters.values())
    extras = ours[len(keras_own.parameters) :]
    assert [p.name for p in extras] == ["preemption_signals", "exit_on_preemption"]
    assert all(p.kind is p.KEYWORD_ONLY for p in extras)


@pytest.mark.parametrize("save_freq", [0, -3, "batch", 1.5, True])
def test_bad_save_freq(save_freq):
    with pytest.raises(ValueError, match=f"Received: save_freq={save_freq!r}"):
        BackupAndRestore("unused", save_freq=save_freq)


def test_resume_after_an_interruption_is_exact(tmp_path, initial, uninterrupted):
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(_model(initial), [BackupAndRestore(backup), Interrupt(2)])
    metadata = json.loads((tmp_path / "backup" / "training_metadata.json").read_text())
    assert metadata["epoch"] == 2

    resumed = _workloads.mlp()  # fresh weights: everything comes from the backup
    history = _fit(resumed, [BackupAndRestore(backup)])
    assert len(history.history["loss"]) == EPOCHS - 2
    _assert_weights_equal(resumed.get_weights(), uninterrupted)
    assert not os.path.exists(backup)  # delete_checkpoint=True


def test_a_crash_before_the_commit_restores_the_previous_backup(
    tmp_path, initial, uninterrupted, monkeypatch
):
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(_model(initial), [BackupAndRestore(backup), Interrupt(2)])
    committed = sorted(os.listdir(backup))

    # A run that dies after writing new weights but before the metadata commit.
    real_write_json = engine._write_json

    def dies_before_commit(path, value):
        raise OSError("killed before the commit")

    monkeypatch.setattr(engine, "_write_json", dies_before_commit)
    with pytest.raises(OSError, match="killed before the commit"):
        _fit(_workloads.mlp(), [BackupAndRestore(backup)])
    assert len(os.listdir(backup)) == len(committed) + 1  # an orphan weights file
    monkeypatch.setattr(engine, "_write_json", real_write_json)

    resumed = _workloads.mlp()
    history = _fit(resumed, [BackupAndRestore(backup, delete_checkpoint=False)])
    assert len(history.history["loss"]) == EPOCHS - 2
    _assert_weights_equal(resumed.get_weights(), uninterrupted)
    assert [n for n in os.listdir(backup) if n.startswith("state-")] == [
        json.loads(open(os.path.join(backup, module.METADATA_FILE)).read())["weights"]
    ]


def test_a_crash_while_writing_weights_leaves_no_half_file(tmp_path, initial):
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(_model(initial), [BackupAndRestore(backup), Interrupt(1)])
    before = {n: open(os.path.join(backup, n), "rb").read() for n in os.listdir(backup)}

    model = _workloads.mlp()

    def dies_halfway(filepath, overwrite=True):
        with open(filepath, "wb") as file:
            file.write(b"\x89HDF\r\n half a file")
        raise OSError("killed while writing")

    model.save_weights = dies_halfway
    with pytest.raises(OSError, match="killed while writing"):
        _fit(model, [BackupAndRestore(backup)])
    after = {n: open(os.path.join(backup, n), "rb").read() for n in os.listdir(backup)}
    assert after == before


def test_restores_a_backup_written_by_stock_keras(tmp_path, initial, uninterrupted):
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(_model(initial), [keras.callbacks.BackupAndRestore(backup), Interrupt(2)])
    assert "latest.weights.h5" in os.listdir(backup)
    resumed = _workloads.mlp()
    history = _fit(resumed, [BackupAndRestore(backup)])
    assert len(history.history["loss"]) == EPOCHS - 2
    _assert_weights_equal(resumed.get_weights(), uninterrupted)


def test_stock_keras_resumes_from_our_backup(tmp_path, initial, uninterrupted):
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(_model(initial), [BackupAndRestore(backup), Interrupt(2)])
    resumed = _workloads.mlp()
    history = _fit(resumed, [keras.callbacks.BackupAndRestore(backup)])
    assert len(history.history["loss"]) == EPOCHS - 2
    _assert_weights_equal(resumed.get_weights(), uninterrupted)


def _corrupt_latest(backup):
    metadata = json.loads(open(os.path.join(backup, module.METADATA_FILE)).read())
    with open(os.path.join(backup, metadata["weights"]), "wb") as file:
        file.write(b"not an h5 file")


def test_double_checkpoint_falls_back_to_the_previous_backup(tmp_path, initial):
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(
            _model(initial),
            [BackupAndRestore(backup, double_checkpoint=True), Interrupt(3)],
        )
    _corrupt_latest(backup)
    resumed = _workloads.mlp()
    history = _fit(resumed, [BackupAndRestore(backup, double_checkpoint=True)])
    assert len(history.history["loss"]) == EPOCHS - 2  # resumed after epoch 2


def test_an_unreadable_backup_is_an_error_that_names_the_directory(tmp_path, initial):
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(_model(initial), [BackupAndRestore(backup), Interrupt(2)])
    _corrupt_latest(backup)
    with pytest.raises(OSError, match="`backup_dir`=.*cannot be read"):
        _fit(_workloads.mlp(), [BackupAndRestore(backup)])


DAMAGES = {
    "truncated": lambda content: content[: len(content) // 2],
    "empty": lambda content: b"",
    "garbage": lambda content: b"\x00\x17\xff not json",
    "not a state": lambda content: b'{"epoch": "two", "batch": 0}',
    "foreign weights": lambda content: b'{"epoch": 2, "weights": "../../x.h5"}',
}


def _damage_metadata(backup, how, suffix=""):
    path = os.path.join(backup, module.METADATA_FILE + suffix)
    with open(path, "rb") as file:
        content = file.read()
    with open(path, "wb") as file:
        file.write(DAMAGES[how](content))


@pytest.fixture(scope="module")
def backup_after_two_epochs(tmp_path_factory):
    """A backup committed after epoch 2 (and 1, with `double_checkpoint`)."""
    backup = str(tmp_path_factory.mktemp("backups") / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(_workloads.mlp(), [BackupAndRestore(backup), Interrupt(2)])
    return backup


@pytest.mark.parametrize("how", sorted(DAMAGES))
def test_a_damaged_metadata_file_is_an_error_not_a_restart(
    tmp_path, backup_after_two_epochs, how
):
    # Before: read as "no backup", so training restarted at epoch 0 from the
    # latest weights (`latest.weights.h5`), silently.
    backup = str(tmp_path / "backup")
    shutil.copytree(backup_after_two_epochs, backup)
    _damage_metadata(backup, how)
    before = sorted(os.listdir(backup))
    with pytest.raises(OSError) as raised:
        _fit(_workloads.mlp(), [BackupAndRestore(backup)])
    message = str(raised.value)
    assert os.path.join(backup, module.METADATA_FILE) in message
    assert "Delete `backup_dir` to start over" in message
    (weights,) = [n for n in before if n.startswith("state-e2-")]
    assert json.dumps({"epoch": 2, "weights": weights}) in message  # the remedy
    assert sorted(os.listdir(backup)) == before  # nothing deleted


def test_keras_own_callback_on_several_workers_reports_a_damaged_backup(
    tmp_path, initial, monkeypatch
):
    # What a user of `keras.callbacks.BackupAndRestore` sees under
    # MultiWorkerReplicator, where it is routed to ours (one process here:
    # routing forced on, this process is the chief).
    from keras_replicator._files import worker_files
    from keras_replicator.keras_integration import _hooks

    _hooks.install()
    monkeypatch.setattr(worker_files, "routes", lambda model: True)
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(_model(initial), [keras.callbacks.BackupAndRestore(backup), Interrupt(2)])
    _damage_metadata(backup, "truncated")
    with pytest.raises(OSError, match="training_metadata.json is not valid JSON"):
        _fit(_workloads.mlp(), [keras.callbacks.BackupAndRestore(backup)])


def test_a_damaged_metadata_file_falls_back_to_the_previous_backup(
    tmp_path, initial, uninterrupted
):
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(
            _model(initial),
            [BackupAndRestore(backup, double_checkpoint=True), Interrupt(3)],
        )
    _damage_metadata(backup, "truncated")
    resumed = _workloads.mlp()
    history = _fit(resumed, [BackupAndRestore(backup, double_checkpoint=True)])
    assert len(history.history["loss"]) == EPOCHS - 2  # exactly from epoch 2
    _assert_weights_equal(resumed.get_weights(), uninterrupted)


def test_batch_frequency_backs_up_mid_epoch(tmp_path, initial):
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit(_model(initial), [BackupAndRestore(backup, save_freq=3), Interrupt(1)])
    metadata = json.loads((tmp_path / "backup" / module.METADATA_FILE).read_text())
    assert metadata["epoch"] == 0 and metadata["batch"] == 2  # 4 batches per epoch


def test_save_freq_false_never_backs_up(tmp_path, initial):
    backup = str(tmp_path / "backup")
    _fit(_model(initial), [BackupAndRestore(backup, save_freq=False)], epochs=2)
    assert not os.path.exists(backup)


def test_a_non_chief_writes_nothing_to_the_backup_dir(tmp_path, initial, monkeypatch):
    from keras_replicator import _roles

    monkeypatch.setattr(_roles, "is_chief", lambda strategy=None: False)
    backup = str(tmp_path / "backup")
    _fit(_model(initial), [BackupAndRestore(backup, delete_checkpoint=False)])
    assert not os.path.exists(backup)


def test_leftovers_of_interrupted_writes_are_cleaned_up(tmp_path, initial):
    backup = tmp_path / "backup"
    backup.mkdir()
    (backup / ".state-e1-b0-aa.kr-tmp-1-2.weights.h5").write_bytes(b"half")
    (backup / "state-e1-b0-0bad.weights.h5").write_bytes(b"orphan")
    (backup / "notes.txt").write_text("not ours")
    _fit(_model(initial), [BackupAndRestore(str(backup), delete_checkpoint=False)], 1)
    names = sorted(os.listdir(backup))
    assert names[0] == module.STOCK_WEIGHTS_FILE and names[1] == "notes.txt"
    assert names[-1] == module.METADATA_FILE and len(names) == 4


def test_an_unbuilt_model_is_explained(tmp_path):
    model = keras.Sequential([keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="needs a built model"):
        model.fit(
            np.ones((4, 2)),
            np.ones((4, 1)),
            verbose=0,
            callbacks=[BackupAndRestore(str(tmp_path))],
        )


KILLED_WHILE_SAVING = """
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
from keras_replicator.callbacks import BackupAndRestore
from keras_replicator.testing import _workloads

backup, initial = sys.argv[1], sys.argv[2]
model = _workloads.mlp()
model.set_weights(list(np.load(initial).values()))
real_save_weights = model.save_weights
saves = []

def dies_in_the_middle_of_the_third_save(path, overwrite=True):
    saves.append(path)
    real_save_weights(path, overwrite=overwrite)
    if len(saves) == 3:
        with open(path, "r+b") as file:
            file.truncate(os.path.getsize(path) // 2)
        os._exit(9)  # no cleanup, no exception handlers: like a SIGKILL

model.save_weights = dies_in_the_middle_of_the_third_save
x, y = _workloads.classification_data(128)
model.fit(x, y, batch_size=32, epochs=4, shuffle=False, verbose=0,
          callbacks=[BackupAndRestore(backup)])
"""


def test_a_process_killed_while_backing_up_resumes_exactly(
    tmp_path, initial, uninterrupted
):
    np.savez(tmp_path / "initial.npz", *initial)
    backup = tmp_path / "backup"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_WHILE_SAVING,
            str(backup),
            str(tmp_path / "initial.npz"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 9, done.stderr[-3000:]
    names = os.listdir(backup)
    assert any(".kr-tmp-" in name for name in names)  # the half-written file
    metadata = json.loads((backup / module.METADATA_FILE).read_text())
    assert metadata["epoch"] == 2  # the third backup never committed

    resumed = _workloads.mlp()
    history = _fit(resumed, [BackupAndRestore(str(backup))])
    assert len(history.history["loss"]) == EPOCHS - 2
    _assert_weights_equal(resumed.get_weights(), uninterrupted)
