"""Preemption (issue 38): a signal stops `fit` after the step in flight, backed up
there, and the next `fit` resumes at the next batch, as if never stopped."""

import json
import os
import signal

import keras
import numpy as np
import pytest

import keras_replicator as kr
from keras_replicator._files import backup as engine
from keras_replicator.callbacks import BackupAndRestore

EPOCHS, BATCH, SAMPLES = 3, 16, 96  # 6 steps an epoch


class SignalAt(keras.callbacks.Callback):
    """Sends this process `number` at the start of batch `at[1]` of epoch `at[0]`,
    as a scheduler would mid-step; records the batches that ran."""

    def __init__(self, at=None, number=signal.SIGTERM):
        super().__init__()
        self.at, self.number, self.epoch, self.ran = at, number, None, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.ran.append((self.epoch, batch))
        if (self.epoch, batch) == self.at:
            os.kill(os.getpid(), self.number)


@pytest.fixture
def float64():
    keras.backend.set_floatx("float64")
    yield
    keras.backend.set_floatx("float32")


def _fit(callbacks, strategy=None):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(SAMPLES, 6)), rng.normal(size=(SAMPLES, 1))
    strategy = strategy or kr.MultiDeviceReplicator(num_replicas=2)
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(8, activation="tanh"),
                keras.layers.Dense(1),
            ]
        )
        # A schedule: the resumed steps must continue its count.
        decay = keras.optimizers.schedules.ExponentialDecay(0.1, 4, 0.5)
        model.compile(keras.optimizers.SGD(decay, momentum=0.5), "mse", metrics=["mae"])
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    return model


def _metadata(directory):
    return json.loads((directory / engine.METADATA_FILE).read_text())


@pytest.mark.parametrize(
    "save_freq",
    [
        "epoch",
        pytest.param(
            4,
            marks=pytest.mark.slow(
                reason="covered in the default run by: the same test [epoch] and "
                "test_a_crash_resumes_exactly_after_the_last_step_backup (an "
                "integer save_freq)"
            ),
        ),
    ],
)
def test_a_signal_backs_up_at_the_step_and_the_next_fit_resumes_there(
    tmp_path, float64, save_freq
):
    plain = _fit([])
    uninterrupted = plain.get_weights()
    backup = BackupAndRestore(
        tmp_path / "b",
        save_freq=save_freq,
        delete_checkpoint=False,
        exit_on_preemption=False,
    )
    signalled = SignalAt((1, 2))
    _fit([backup, signalled])
    assert backup.preempted
    assert signalled.ran[-1] == (1, 2)  # the step in flight finished, no other
    metadata = _metadata(tmp_path / "b")
    assert (metadata["epoch"], metadata["batch"], metadata["resume_batch"]) == (1, 2, 3)
    # Python's handler is back once `fit` is over.
    assert signal.getsignal(signal.SIGTERM) is not backup._kr_preemption._record

    resumed = SignalAt()
    model = _fit([BackupAndRestore(tmp_path / "b", save_freq=save_freq), resumed])
    assert resumed.ran[0] == (1, 3)  # the next batch of the same epoch
    assert len(resumed.ran) == 3 + 6
    for got, want in zip(model.get_weights(), uninterrupted):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    # The interrupted epoch's logs cover all of it: the metrics' state was kept.
    assert model.history.epoch == [1, 2]
    for name in ("loss", "mae"):
        np.testing.assert_allclose(
            model.history.history[name], plain.history.history[name][1:], rtol=1e-12
        )


def test_by_default_the_process_exits_with_0_after_the_backup(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        _fit([BackupAndRestore(tmp_path / "b"), SignalAt((0, 4))])
    assert exit_.value.code == 0
    assert _metadata(tmp_path / "b")["resume_batch"] == 5


def test_a_user_set_signal_and_none(tmp_path):
    backup = BackupAndRestore(
        tmp_path / "b", preemption_signals="SIGUSR1", exit_on_preemption=False
    )
    _fit([backup, SignalAt((0, 1), signal.SIGUSR1)])
    assert backup.preempted
    with pytest.raises(ValueError, match="Received: preemption_signals="):
        BackupAndRestore(tmp_path, preemption_signals=["SIGNOPE"])


def test_without_a_signal_nothing_changes(tmp_path):
    backup = BackupAndRestore(tmp_path / "b", exit_on_preemption=False)
    _fit([backup])
    assert not backup.preempted and not os.path.exists(tmp_path / "b")


class CrashAt(SignalAt):
    """Raises at the start of batch `at[1]` of epoch `at[0]`: a worker lost."""

    def on_train_batch_begin(self, batch, logs=None):
        self.ran.append((self.epoch, batch))
        if (self.epoch, batch) == self.at:
            raise RuntimeError("lost")


@pytest.mark.parametrize("crash_at, resume_at", [((1, 4), (1, 3)), ((2, 0), (2, 0))])
def test_a_crash_resumes_exactly_after_the_last_step_backup(
    tmp_path, float64, crash_at, resume_at
):
    # Integer save_freq backs up every 3 steps with the batch to resume from:
    # after epoch 1's batch 2, or at epoch 1's last batch (resumed as epoch 2).
    uninterrupted = _fit([]).get_weights()
    with pytest.raises(RuntimeError, match="lost"):
        _fit([BackupAndRestore(tmp_path / "b", save_freq=3), CrashAt(crash_at)])
    resumed = SignalAt()
    model = _fit([BackupAndRestore(tmp_path / "b", save_freq=3), resumed])
    assert resumed.ran[0] == resume_at
    for got, want in zip(model.get_weights(), uninterrupted):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_a_preempted_worker_tells_its_launcher(tmp_path, monkeypatch):
    mark = tmp_path / "preempted"
    monkeypatch.setenv("KERAS_REPLICATOR_PREEMPTED_FILE", str(mark))
    backup = BackupAndRestore(tmp_path / "b", exit_on_preemption=False)
    _fit([backup])
    assert not mark.exists()  # finished: nothing to tell
    _fit([BackupAndRestore(tmp_path / "b", exit_on_preemption=False), SignalAt((0, 2))])
    assert mark.read_text() == "epoch 0, after batch 2\n"


def test_between_workers_a_steps_agreement_is_read_after_the_next_step():
    # Issue 48, item 14: the value a step returns is never read right after that
    # step (the read would wait for it), only after the next one or at the epoch end.
    import tensorflow as tf

    from keras_replicator._worker import preemption as _preemption

    class Model:  # what the agreement is keyed by; any object will do here
        pass

    model, preemption = Model(), _preemption.Preemption([])
    agreement = _preemption.StepAgreement(preemption, model)
    assert _preemption.step_agreement(model) is agreement
    assert float(agreement.local_flag()) == 0.0
    preemption.received = signal.SIGTERM
    assert float(agreement.local_flag()) == 1.0
    agreement.record(tf.constant(0.0))
    agreement.record(tf.constant(0.5))  # this step carried a flag...
    assert not agreement.stop_after_this_step()  # ...read after the next one
    agreement.record(tf.constant(0.5))
    assert agreement.stop_after_this_step()
    agreement.forget()  # a new epoch: nothing carries over
    assert not agreement.stop_after_this_step()
    agreement.record(tf.constant(0.5))
    assert not agreement.stop_after_this_step() and agreement.stop_at_epoch_end()
    agreement.end()
    assert _preemption.step_agreement(model) is None
    assert not agreement.stop_at_epoch_end()


@pytest.mark.parametrize("agreed", [0.25, -0.5, float("nan"), float("inf"), -1.0])
def test_any_agreed_flag_but_zero_stops(agreed):
    """Issue 49, item 11. Before: "mean > 0", so a member sending NaN or a negative
    number hid another worker's signal."""
    import tensorflow as tf

    from keras_replicator._worker import preemption as _preemption

    class Model:
        pass

    agreement = _preemption.StepAgreement(_preemption.Preemption([]), Model())
    agreement.record(tf.constant(0.0))
    assert not agreement.stop_at_epoch_end()
    agreement.record(tf.constant(agreed))
    agreement.record(tf.constant(-0.0))
    assert agreement.stop_after_this_step()
    assert not agreement.stop_at_epoch_end()  # exactly 0, of either sign: go on
    agreement.end()
