"""A file the OS cannot flush fails the save before it is published (issue 49,
item 7): the previous backup stays whole."""

import errno
import json
import os
import stat

import pytest

from keras_replicator._files import backup as engine
from keras_replicator._files.atomic_publish import write_atomically
from keras_replicator.callbacks import BackupAndRestore
from keras_replicator.testing import _workloads


@pytest.fixture
def failing_fsync(monkeypatch):
    """`os.fsync` of regular files fails with EIO, as on a failing disk."""
    real = os.fsync

    def fsync(descriptor):
        if stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(descriptor)

    def arm():
        monkeypatch.setattr(os, "fsync", fsync)

    return arm


def test_an_fsync_error_publishes_nothing(tmp_path, failing_fsync):
    target = tmp_path / "out.txt"
    target.write_text("previous")
    failing_fsync()
    with pytest.raises(OSError, match="previous version stays") as raised:
        write_atomically(str(target), lambda path: open(path, "w").write("new"))
    assert raised.value.errno == errno.EIO
    assert target.read_text() == "previous"
    assert os.listdir(tmp_path) == ["out.txt"]  # no staging left


def test_an_fsync_error_keeps_the_previous_backup(tmp_path, failing_fsync):
    """Before: the weights and the metadata were published despite EIO."""
    x, y = _workloads.classification_data(64)
    directory = str(tmp_path / "backup")

    def fit(epochs):
        callback = BackupAndRestore(directory, delete_checkpoint=False)
        model = _workloads.mlp()
        model.fit(x, y, batch_size=32, epochs=epochs, verbose=0, callbacks=[callback])

    fit(1)
    metadata_path = os.path.join(directory, engine.METADATA_FILE)
    with open(metadata_path) as file:
        before = json.load(file)
    names = sorted(os.listdir(directory))
    failing_fsync()
    with pytest.raises(OSError, match="Input/output error"):
        fit(2)
    with open(metadata_path) as file:
        assert json.load(file) == before
    assert sorted(os.listdir(directory)) == names
