"""A backup's metadata fields are checked against the `fit` that resumes (issue 49,
item 4): out of bounds is one `ValueError` naming the file, the field and the value,
before anything is restored or deleted."""

import json

import numpy as np
import pytest

from keras_replicator._files import backup as engine
from keras_replicator._files.backup_fields import (
    MAX_METRIC_VALUES,
    check_fields,
    check_metrics,
)
from keras_replicator.callbacks import BackupAndRestore
from keras_replicator.testing import _workloads

EPOCHS, SAMPLES, BATCH = 2, 64, 16  # 4 steps an epoch
WEIGHTS = "state-e1-b1-0123abcd.weights.h5"
METRICS = [["loss/total", "float32", 2.5], ["loss/count", "float32", 2.0]]


def _plant(directory, **fields):
    """A backup as this library writes it, with `fields` replaced."""
    directory.mkdir(exist_ok=True)
    model = _workloads.mlp()
    model.optimizer.build(model.trainable_variables)
    model.save_weights(str(directory / WEIGHTS))
    metadata = {"epoch": 1, "batch": 1, "weights": WEIGHTS, "resume_batch": 2}
    metadata["metrics"] = METRICS
    metadata.update(fields)
    (directory / engine.METADATA_FILE).write_text(json.dumps(metadata))
    return metadata


def _fit(directory):
    x, y = _workloads.classification_data(SAMPLES)
    model = _workloads.mlp()
    callback = BackupAndRestore(str(directory), delete_checkpoint=False)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, callbacks=[callback])
    return model


@pytest.mark.parametrize(
    "field, value",
    [
        ("resume_batch", 10**12),  # used to skip the rest of the epoch silently
        ("resume_batch", -3),  # used to train batches the weights already hold
        ("resume_batch", "2"),
        ("resume_batch", True),
        ("epoch", 10**9),  # used to train nothing, then delete the backup
        ("epoch", EPOCHS),  # a mid-epoch backup of an epoch this fit has not
        ("metrics", [["loss/total", "S900000000", [1]]]),  # used to allocate 0.9 GB
        ("metrics", [["loss/total", "float32", float("nan")]]),  # logged as loss
        ("metrics", [["loss/total", "float32", 1e300]]),
        ("metrics", [["loss/total", "float32", ["1.5"]]]),
        ("metrics", [["loss/total", "int32", 2**40]]),
        ("metrics", {"loss/total": 1.0}),
    ],
)
def test_a_field_out_of_bounds_is_a_named_error_before_anything_changes(
    tmp_path, field, value
):
    directory = tmp_path / "backup"
    _plant(directory, **{field: value})
    before = sorted(p.name for p in directory.iterdir())
    with pytest.raises(ValueError) as raised:
        _fit(directory)
    message = str(raised.value)
    assert f"`{field}" in message and engine.METADATA_FILE in message
    assert "Received:" in message and "Delete `backup_dir`" in message
    assert sorted(p.name for p in directory.iterdir()) == before


def test_backups_this_library_writes_pass(tmp_path):
    # The last step of an epoch (resume_batch == steps) and a finished fit kept
    # with `delete_checkpoint=False` (epoch == epochs) are ordinary backups.
    params = {"epochs": EPOCHS, "steps": SAMPLES // BATCH}
    for metadata in (
        {"epoch": 1, "resume_batch": 4, "metrics": METRICS},
        {"epoch": EPOCHS, "batch": 0},
        {"epoch": 0, "resume_batch": 0, "metrics": None},
    ):
        check_fields(metadata, "m.json", "b", params)
    directory = tmp_path / "backup"
    _plant(directory, epoch=EPOCHS, resume_batch=None, metrics=None)
    metadata = json.loads((directory / engine.METADATA_FILE).read_text())
    del metadata["resume_batch"], metadata["metrics"]
    (directory / engine.METADATA_FILE).write_text(json.dumps(metadata))
    assert _fit(directory).history.epoch == []  # done already: nothing to train


def test_without_known_bounds_only_the_types_and_signs_are_checked():
    check_fields({"epoch": 7, "resume_batch": 10**6}, "m.json", "b", {"steps": None})
    with pytest.raises(ValueError, match="resume_batch=-1"):
        check_fields({"epoch": 7, "resume_batch": -1}, "m.json", "b", None)


def test_metric_values_are_bounded_in_number_and_range():
    check_metrics([["m/c", "int64", [[1, 2], [3, 4]]]], "m.json", "b")
    check_metrics([["m/c", "uint8", 255]], "m.json", "b")
    with pytest.raises(ValueError, match="fit uint8"):
        check_metrics([["m/c", "uint8", 256]], "m.json", "b")
    with pytest.raises(ValueError, match="at most"):
        check_metrics([["m/c", "float32", [[1.0, 2.0], [3.0]]]], "m.json", "b")
    too_many = np.zeros(MAX_METRIC_VALUES // 2 + 1).tolist()  # 2 halves: too many
    with pytest.raises(ValueError, match="at most"):
        check_metrics(
            [["a", "float32", too_many], ["b", "float32", too_many]], "m", "b"
        )
