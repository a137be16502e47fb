"""Preemption between real worker processes on 127.0.0.1 (issue 38).

SIGTERM reaches one of 2 workers in the middle of an epoch (from inside the
worker, at a known batch, through the real handler); both workers stop after
the same step (one after it: the agreement rides the steps, `_preemption`),
back up at it and exit with 0; the next start resumes at the next
batch and ends with the weights of one device that was never stopped.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from keras_replicator.launch import run_workers
from tests.callbacks._float64_worker import PRELUDE

pytestmark = pytest.mark.multi_worker

_SCRIPT = PRELUDE + textwrap.dedent(
    """
    backup_dir, signal_at = sys.argv[1], json.loads(sys.argv[2])

    class SignalAt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
        def on_train_batch_begin(self, batch, logs=None):
            if signal_at and [self.epoch, batch, worker] == signal_at:
                print(f"SIGNALLED {time.monotonic()}", flush=True)
                os.kill(os.getpid(), signal.SIGTERM)

    callbacks = []
    if backup_dir != "-":
        kind = keras.callbacks if which == "keras" else kr.callbacks
        callbacks = [kind.BackupAndRestore(backup_dir), SignalAt()]
    try:
        validation = (x[:16], y[:16]) if which.endswith("validated") else None
        model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0,
                  callbacks=callbacks, validation_data=validation)
    except SystemExit:
        print(f"EXITED {time.monotonic()}", flush=True)
        raise
    print("WEIGHTS " + json.dumps([w.tolist() for w in model.get_weights()]))
    """
)


def _weights(output):
    line = next(ln for ln in output.splitlines() if ln.startswith("WEIGHTS "))
    return [np.asarray(w) for w in json.loads(line[len("WEIGHTS ") :])]


def _one_device(which):
    """The weights of one device that was never stopped (no `TF_CONFIG`)."""
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT, "-", "null", which],
        env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return _weights(run.stdout + run.stderr)


def _stamp(output, word):
    line = next(ln for ln in output.splitlines() if ln.startswith(word + " "))
    return float(line.split()[1])


@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    "which, signal_at, stop_at",
    [
        # kr.callbacks.BackupAndRestore on the socket ring. The flag rides the
        # signalled step (batch 2) and is read one step late (`_preemption`):
        # both stop after batch 3. In an epoch's last step (batch 5) it is read
        # at the epoch's end: both stop after it.
        pytest.param(
            "ours",
            [1, 2, 1],
            (1, 3),
            marks=pytest.mark.slow(
                reason="covered in the default run by: the same test "
                "[ours-validated-signal_at2-stop_at2] (one of two workers "
                "signalled, both back up at one step and resume exactly) and "
                "tests/callbacks/test_preemption.py::"
                "test_between_workers_a_steps_agreement_is_read_after_the_next_step "
                "(the flag read one step late)"
            ),
        ),
        pytest.param(
            "ours",
            [0, 5, 0],
            (0, 5),
            marks=pytest.mark.slow(
                reason="covered in the default run by: the same test "
                "[ours-validated-signal_at2-stop_at2] (the same epoch-end signal)"
            ),
        ),
        # ... before `fit`'s validation, which resets the metrics the backup
        # keeps (the epoch's training sums, not the validation's).
        ("ours-validated", [0, 5, 0], (0, 5)),
        # Keras' own callback (routed to ours), TF's collectives, shard_weight_update.
        pytest.param("keras", [1, 2, 1], (1, 3), marks=pytest.mark.slow),
        pytest.param("collective", [1, 2, 1], (1, 3), marks=pytest.mark.slow),
        pytest.param("sharded", [1, 2, 1], (1, 3), marks=pytest.mark.slow),
    ],
)
def test_sigterm_to_one_of_two_workers_backs_up_at_the_step_and_resumes_exactly(
    tmp_path, which, signal_at, stop_at
):
    expected = _one_device(which)
    backup = str(tmp_path / "backup")
    command = [sys.executable, "-c", _SCRIPT, backup]

    stopped = run_workers(
        command + [json.dumps(signal_at), which], 2, timeout=180, echo=False
    )
    outputs = [w.output for w in stopped.workers]
    assert [w.returncode for w in stopped.workers] == [0, 0], outputs
    assert not any("WEIGHTS" in out for out in outputs)  # neither trained on
    where = "backed up at epoch {}, after batch {}".format(*stop_at)
    assert all(where in out for out in outputs), outputs  # the same step on both
    # The signalled worker was out within seconds (a grace period is ~30 s).
    signalled = outputs[signal_at[2]]
    assert _stamp(signalled, "EXITED") - _stamp(signalled, "SIGNALLED") < 15
    with open(os.path.join(backup, "training_metadata.json")) as file:
        metadata = json.load(file)
    assert (metadata["epoch"], metadata["batch"], metadata["resume_batch"]) == (
        *stop_at,
        stop_at[1] + 1,
    )
    # The loss's sums cover the epoch's batches so far: 16 samples a step.
    counts = {path: values for path, _, values in metadata["metrics"]}
    assert counts["loss/count"] == 16 * (stop_at[1] + 1), metadata["metrics"]

    resumed = run_workers(command + ["null", which], 2, timeout=180, echo=False)
    assert resumed.ok, [w.output for w in resumed.workers]
    for worker in resumed.workers:
        for got, want in zip(_weights(worker.output), expected):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("which", ["ours", "sharded"])
def test_a_backup_made_on_three_workers_resumes_on_two_like_one_device(tmp_path, which):
    # The numbers side of elastic training (issue 38): the global batch is the
    # user's, so 3 workers up to the backup and 2 after it train like one device.
    expected = _one_device(which)
    command = [sys.executable, "-c", _SCRIPT, str(tmp_path / "backup")]
    stopped = run_workers(command + ["[1, 1, 2]", which], 3, timeout=240, echo=False)
    assert [w.returncode for w in stopped.workers] == [0, 0, 0], [
        w.output[-2000:] for w in stopped.workers
    ]
    resumed = run_workers(command + ["null", which], 2, timeout=240, echo=False)
    assert resumed.ok, [w.output[-2000:] for w in resumed.workers]
    for worker in resumed.workers:
        for got, want in zip(_weights(worker.output), expected):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
