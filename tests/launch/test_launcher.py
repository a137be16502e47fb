"""launch(): restarts on top of the runner, and the end-to-end resume test."""

import glob
import os
import sys
import textwrap

import numpy as np
import pytest

from keras_replicator.launch import launch

PY = sys.executable

FAIL_ON_FIRST_RUN = (
    "import os\n"
    "run = int(os.environ['KERAS_REPLICATOR_RESTART_COUNT'])\n"
    "index = os.environ['KERAS_REPLICATOR_WORKER_INDEX']\n"
    "print('run', run)\n"
    "if run == 0 and index == '1':\n"
    "    raise SystemExit('worker one broke on the first run')\n"
)


def test_a_failed_group_is_restarted_and_succeeds():
    result = launch(
        [PY, "-c", FAIL_ON_FIRST_RUN], 2, max_restarts=1, timeout=60, echo=False
    )
    assert result.ok and result.restarts == 1
    assert [w.output.strip() for w in result.workers] == ["run 1", "run 1"]
    (first,) = result.previous
    assert first.first_failure.index == 1
    assert "worker one broke" in first.first_failure.output
    assert result.total_seconds >= result.seconds


def test_restarts_stop_after_max_restarts():
    code = "raise SystemExit(5)"
    result = launch([PY, "-c", code], 2, max_restarts=2, timeout=60, echo=False)
    assert not result.ok
    assert result.restarts == 2 and len(result.previous) == 2
    assert result.first_failure.returncode == 5


def test_no_restart_without_max_restarts():
    result = launch([PY, "-c", FAIL_ON_FIRST_RUN], 2, timeout=60, echo=False)
    assert not result.ok and result.restarts == 0 and result.previous == ()


def test_timeout_covers_all_runs_and_is_not_restarted():
    result = launch(
        [PY, "-c", "import time; time.sleep(30)"],
        2,
        max_restarts=3,
        timeout=1.5,
        grace_seconds=1,
        echo=False,
    )
    assert result.timed_out and result.restarts == 0
    assert result.seconds < 15


def test_restart_notes_name_the_failing_worker(capfd):
    launch([PY, "-c", FAIL_ON_FIRST_RUN], 2, max_restarts=1, timeout=60)
    err = capfd.readouterr().err
    assert "worker 1 exited with code 1" in err
    assert "Restarting all 2 workers (restart 1 of 1)" in err


def test_each_run_gets_fresh_ports():
    code = "import os; print(os.environ['TF_CONFIG'])"
    failing = (
        code + "; raise SystemExit(os.environ['KERAS_REPLICATOR_RESTART_COUNT'] == '0')"
    )
    result = launch([PY, "-c", failing], 2, max_restarts=1, timeout=60, echo=False)
    assert result.ok
    assert result.previous[0].workers[0].output != result.workers[0].output


def test_dry_run_starts_nothing(capsys, tmp_path):
    marker = tmp_path / "ran"
    result = launch([PY, "-c", f"open({str(marker)!r}, 'w')"], 3, dry_run=True)
    out = capsys.readouterr().out
    assert result.ok and result.workers == ()
    assert not marker.exists()
    assert out.count("TF_CONFIG=") == 3
    assert '"task": {"index": 2, "type": "worker"}' in out


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"command": []}, ValueError, "Received: command=\\[\\]"),
        ({"command": "python train.py"}, ValueError, "non-empty list"),
        ({"command": ["no-such-program-kr"]}, ValueError, "command\\[0\\]"),
    ],
)
def test_bad_command(kwargs, error, match):
    with pytest.raises(error, match=match):
        launch(num_workers=2, **kwargs)


def test_max_restarts_is_refused_for_a_scheduler_cluster(monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG",
        '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},'
        ' "task": {"type": "worker", "index": 0}}',
    )
    with pytest.raises(ValueError, match="Received: max_restarts=1"):
        launch([PY, "-c", "pass"], max_restarts=1)


# The end-to-end test of issue 6: two workers train with BackupAndRestore and
# ModelCheckpoint pointed at the same paths; worker 1 dies mid-epoch on the first
# run; the launcher restarts the group; the final weights must equal one device.

EPOCHS = 4
KILL_EPOCH, KILL_BATCH = 2, 3
GLOBAL_BATCH = 64
NUM_SAMPLES = 512

RESUME_WORKER = textwrap.dedent(
    f"""
    import os, sys
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import keras_replicator as kr
    from keras_replicator.callbacks import BackupAndRestore, ModelCheckpoint
    from keras_replicator.testing import _workloads

    out = sys.argv[1]
    index = int(os.environ["KERAS_REPLICATOR_WORKER_INDEX"])
    run = int(os.environ["KERAS_REPLICATOR_RESTART_COUNT"])
    strategy = kr.MultiWorkerReplicator()
    with strategy.scope():
        model = _workloads.mlp()
    model.load_weights(os.path.join(out, "initial.weights.h5"))
    x, y = _workloads.classification_data({NUM_SAMPLES})

    class DieMidEpoch(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if (run, index, self.epoch, batch) == (0, 1, {KILL_EPOCH}, {KILL_BATCH}):
                print("worker 1 dies now", flush=True)
                os._exit(17)

    callbacks = [
        BackupAndRestore(os.path.join(out, "backup")),
        ModelCheckpoint(
            os.path.join(out, "ckpt", "epoch-{{epoch}}.weights.h5"),
            save_weights_only=True,
        ),
        DieMidEpoch(),
    ]
    history = model.fit(
        x, y, batch_size={GLOBAL_BATCH}, epochs={EPOCHS}, shuffle=False,
        verbose=0, callbacks=callbacks,
    )
    print("epochs run:", len(history.history["loss"]), flush=True)
    if index == 0:
        np.savez(os.path.join(out, "final.npz"), *model.get_weights())
    """
)


def _reference_run(initial_path):
    """Single-device weights after each epoch, from the same initial weights."""
    import keras

    from keras_replicator.testing import _workloads

    model = _workloads.mlp()
    model.load_weights(initial_path)
    per_epoch = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: per_epoch.append(model.get_weights())
    )
    x, y = _workloads.classification_data(NUM_SAMPLES)
    model.fit(
        x,
        y,
        batch_size=GLOBAL_BATCH,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[record],
    )
    return per_epoch


def _max_difference(weights_a, weights_b):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights_a, weights_b))


@pytest.mark.multi_worker
@pytest.mark.timeout(600)
@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer")
def test_kill_mid_epoch_restart_resumes_exactly(tmp_path):
    import h5py

    from keras_replicator.testing import _workloads

    initial = str(tmp_path / "initial.weights.h5")
    _workloads.mlp().save_weights(initial)
    script = tmp_path / "train.py"
    script.write_text(RESUME_WORKER)

    result = launch(
        [PY, str(script), str(tmp_path)],
        2,
        max_restarts=1,
        timeout=480,
        echo=False,
        env={"KERAS_REPLICATOR_COLLECTIVE_TIMEOUT": "60"},
    )
    assert result.ok, result.describe_failure()
    assert result.restarts == 1
    first = result.previous[0]
    assert first.first_failure.index == 1 and first.first_failure.returncode == 17
    assert "worker 1 dies now" in first.workers[1].output
    # The second run resumed after the last completed epoch.
    assert "epochs run: 2" in result.workers[0].output

    reference = _reference_run(initial)
    final = np.load(tmp_path / "final.npz")
    final = [final[f"arr_{i}"] for i in range(len(final.files))]
    difference = _max_difference(final, reference[-1])
    print(f"resumed run vs one device: max |difference| = {difference:.2e}")
    print(f"first run {first.seconds:.1f} s, second run {result.seconds:.1f} s")
    assert difference <= 1e-6

    # Every checkpoint at its final name is complete and holds that epoch's
    # single-device weights; both workers wrote "the same file" without a clash.
    for epoch in range(1, EPOCHS + 1):
        path = tmp_path / "ckpt" / f"epoch-{epoch}.weights.h5"
        with h5py.File(path, "r"):
            pass
        model = _workloads.mlp()
        model.load_weights(str(path))
        assert _max_difference(model.get_weights(), reference[epoch - 1]) <= 1e-6
    assert not (tmp_path / "backup").exists()  # deleted after training, by the chief
    leftovers = glob.glob(str(tmp_path / "ckpt" / ".*"))
    assert all(".kr-tmp-" in name for name in leftovers)
    assert os.listdir(tmp_path / "ckpt")


HUNG_PEER = textwrap.dedent(
    """
    import os, time
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import keras_replicator as kr
    from keras_replicator.testing import _workloads

    index = int(os.environ["KERAS_REPLICATOR_WORKER_INDEX"])
    strategy = kr.MultiWorkerReplicator()
    with strategy.scope():
        model = _workloads.mlp()
    x, y = _workloads.classification_data(512)

    class Stall(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if index == 1 and batch == 2:
                print(f"STALL {time.time()}", flush=True)
                time.sleep(600)  # alive, holding its sockets, never answering

    try:
        model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=[Stall()])
    except Exception as error:
        named = "collective timeout" in str(error)
        print(f"FAILED {time.time()} {type(error).__name__} {named}", flush=True)
        raise
    """
)


@pytest.mark.multi_worker
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_hung_peer_becomes_an_error_within_the_collective_timeout():
    collective_timeout = 15
    result = launch(
        [PY, "-c", HUNG_PEER],
        2,
        timeout=400,
        echo=False,
        grace_seconds=2,
        env={"KERAS_REPLICATOR_COLLECTIVE_TIMEOUT": str(collective_timeout)},
    )
    assert not result.ok and not result.timed_out, result.describe_failure()
    survivor, hung = result.workers
    assert result.first_failure is survivor and hung.stopped
    stalled_at = float(hung.output.split("STALL ")[1].split()[0])
    failed_at, error, named = survivor.output.split("FAILED ")[1].split()[:3]
    waited = float(failed_at) - stalled_at
    print(f"survivor raised {error} {waited:.1f} s after its peer stalled")
    assert collective_timeout - 1 <= waited <= collective_timeout + 30
    # TensorFlow's collectives raise DeadlineExceededError; the socket ring (the
    # default between CPU workers) raises inside a `tf.numpy_function`, which
    # TensorFlow reports as UnknownError whatever the Python error: its message
    # names the collective timeout.
    assert error == "DeadlineExceededError" or (
        error == "UnknownError" and named == "True"
    ), (error, named)
    assert "while worker(s) [1] were still running" in result.headline()


def test_a_lost_port_is_retried_on_fresh_ports(tmp_path, capfd):
    """Another process may take a port between the launcher's choice and TF's bind:
    a local group then starts again on fresh ports, not counted as a restart."""
    code = (
        "import os, sys\n"
        "if not os.path.exists('lost'):\n"
        "    open('lost', 'w').close()\n"
        "    print('UnknownError: Could not start gRPC server', file=sys.stderr)\n"
        "    sys.exit(1)\n"
        "print('ran on', os.environ['TF_CONFIG'])\n"
    )
    result = launch([PY, "-c", code], 1, timeout=60, cwd=str(tmp_path))
    assert result.ok and result.restarts == 0
    (lost,) = result.previous
    assert lost.lost_port is not None
    err = capfd.readouterr().err
    assert "Starting again on fresh ports" in err
    assert "`TF_CONFIG['cluster']['worker'][0]`" in err
