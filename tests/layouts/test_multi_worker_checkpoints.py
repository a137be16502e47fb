"""Backups and `.keras` files of a mesh over 2 workers hold the chief's files only.

Issue 52's "`.keras` and `BackupAndRestore` save full weights and load into any
layout", on 2 worker processes x 2 logical CPUs (`launch_function`, each worker
its own `TF_CONFIG`): `test_checkpoints`' Megatron MLP (float64, SGD with
momentum) on one 2x2 ["batch", "model"] mesh spanning both workers.

Saving reads every weight whole, a gather over the workers, so every worker must
save; to TensorFlow each worker is a `OneDeviceStrategy` and so "the chief".
The library routes their files as under `MultiWorkerReplicator`: worker index =
DTensor client id, chief = client 0, whose file is published atomically while
the others write to scratch (no h5 lock error, no torn or stray files).

The interruption is an exception raised on every worker after epoch 2 of 4,
as a crash or a preemption that kills the job: `fit` never reaches
`on_train_end`, so the backup stays (`model.stop_training = True` would end
`fit` normally, and `BackupAndRestore` would delete the finished backup). The
second launch starts the same `fit` with the same `backup_dir`.
"""

import json
import os

import keras
import numpy as np
import pytest

from keras_replicator.launch import launch_function
from tests.layouts import _multi_worker_checkpoints_job as job
from tests.layouts.test_checkpoints import (
    TOLERANCE,
    build,
    fit,
    max_gap,
    on_one_device,
    predict,
    state,
)

EXACT = 1e-12  # a load copies values: only the predictions' rounding differs


def launch(phase, root, tmp_path):
    scratch = tmp_path / "tmp"  # the workers' `tempfile` directory, for `scratch_left`
    scratch.mkdir(exist_ok=True)
    return launch_function(
        job.checkpoints_on_two_workers,
        2,
        args=(phase, str(root)),
        env={"TMPDIR": str(scratch)},
        timeout=240,
        echo=False,
    )


def scratch_writes(names):
    """What a worker wrote to scratch, in order, without the backups' tokens."""
    return [name.rsplit("-", 1)[0] if "-b0-" in name else name for name in names]


@pytest.mark.timeout(300)
def test_backups_resume_and_one_keras_file_on_two_workers(float64, tmp_path):
    root = tmp_path / "run"
    interrupted = launch("interrupt", root, tmp_path)
    for index, worker in enumerate(interrupted):
        assert worker["worker_index"] == index
        assert worker["chief"] == (index == 0)
        for name in job.BACKUPS:
            assert worker["runs"][name] == {"interrupted": "stopped after epoch 2"}
        check_worker(worker)
    # Only the chief's backups reach `backup_dir`; worker 1's go to scratch.
    assert interrupted[0]["scratch"] == []
    assert (
        scratch_writes(interrupted[1]["scratch"]) == ["state-e1-b0", "state-e2-b0"] * 2
    )
    for name in job.BACKUPS:
        check_chief_backup(root / name)

    resumed = launch("resume", root, tmp_path)
    one_device = build()
    fit(one_device, 4)
    expected = state(one_device)
    gaps = []
    for worker in resumed:
        check_worker(worker)
        for name in job.BACKUPS:
            run = worker["runs"][name]
            assert run["epochs"] == [2, 3]  # resumed after epoch 2
            gaps.append(max_gap(run["state"], expected))
    assert max(gaps) < TOLERANCE, gaps
    # Worker 1: epochs 3 and 4 of Keras' backup and `ModelCheckpoint`, then of
    # ours. Its `model.save` of one local file is published like the chief's.
    assert resumed[0]["scratch"] == []
    assert scratch_writes(resumed[1]["scratch"]) == [
        "state-e3-b0",
        "last.weights.h5",
        "state-e4-b0",
        "last.weights.h5",
        "state-e3-b0",
        "state-e4-b0",
    ]
    for name in job.BACKUPS:  # a finished `fit` deletes its backup
        assert not os.path.exists(root / name)
    assert os.listdir(root / "checkpoint") == ["last.weights.h5"]
    assert os.listdir(root / "saved") == ["model.keras"]

    # Both files load on one device: the final weights, the mesh's predictions.
    checkpointed = on_one_device()
    checkpointed.load_weights(root / "checkpoint" / "last.weights.h5")
    assert max_gap(weights(checkpointed), weights(one_device)) < TOLERANCE
    loaded = keras.models.load_model(root / "saved" / "model.keras")
    assert max_gap(state(loaded), expected) < TOLERANCE
    for worker in resumed:
        np.testing.assert_allclose(
            worker["predictions"], predict(loaded), rtol=0, atol=EXACT
        )


def check_chief_backup(backup_dir):
    """`backup_dir` holds one writer's backup after epoch 2: the chief's."""
    names = sorted(os.listdir(backup_dir))
    (weights_file,) = [n for n in names if n.startswith("state-")]
    assert weights_file.startswith("state-e2-b0-")
    assert names == sorted(
        ["latest.weights.h5", "training_metadata.json", weights_file]
    )
    with open(backup_dir / "training_metadata.json") as file:
        assert json.load(file) == {"epoch": 2, "batch": 0, "weights": weights_file}


def check_worker(worker):
    """Ours warns that preemption is off on a mesh over workers; Keras' is silent."""
    (warning,) = worker["warnings"]
    assert warning.startswith("`preemption_signals` (SIGTERM) cannot be honoured")
    assert "spans 2 workers" in warning and "preemption_signals=()" in warning
    assert worker["scratch_left"] == []  # every scratch directory was removed


def weights(model):
    return [np.asarray(w) for w in model.weights]
