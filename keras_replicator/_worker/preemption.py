"""Preemption: a signal stops `fit` after a step every worker agrees on (issue 38).

Cloud VMs and schedulers announce a preemption with SIGTERM and a grace period.
TensorFlow's multi-worker runtime installs a low-level SIGTERM handler of its own
when the strategy is built, so Python never sees the signal and `fit` trains on
to the end (issue 38). `Preemption.listen` installs a Python handler in its
place while `fit` runs (the one Python saw before comes back after), and it only
records the signal: the step in flight finishes. The workers then agree on one
step to stop after, so all of them back up at it and exit together: a worker
that stopped alone would leave the others waiting in their next collective.

How they agree (issue 48, item 14): the agreement rides the training step's own
log all-reduce (`StepAgreement`). Each step carries this worker's flag (0 or 1,
a step-function argument) as one more float beside the loss, and every worker
gets the same mean back; any mean but exactly 0 (NaN included) means stop. The
callback reads the agreement of the step *before* the one that just returned, a
value already computed when the next step was queued, so it adds no collective
of its own and, on CPU workers, waits for nothing (the step that just returned
is done); every worker reads the same value after the same batch, so all stop
after the same step. (On a GPU, TensorFlow's device-to-host copy of even an
earlier value waits for the work queued on the device before it: whether that
read stalls the queued step is a check for a GPU machine,
`benchmarks/preemption_agreement.py`.)

The price is a step: the flag rides the first step queued after the signal is
heard, and that step's agreement is read after the next one. A signal that
arrives while step N runs (the usual case: Python runs the handler when the
step returns) stops every worker after step N+2, where the eager agreement this
replaced (a 4-byte all-reduce and `.numpy()` after every step: a host sync
between steps) stopped them after step N; the grace period must cover those
steps and the backup. The last step of an epoch is read at the epoch's end, so
an agreement never carries over into the next epoch. A dead peer fails the
step's own collective, as it did before: an error, not a hang. Without
preemption signals the step is the plain one. One process (any strategy but a
multi-worker Replicator) answers for itself after every step, with no lag.

Hand-written: TensorFlow's `PreemptionCheckpointHandler` does this for custom
training loops only (it saves a `tf.train.Checkpoint` at a step counter of its
own, not Keras 3 `fit`), and Keras has no preemption support.
"""

from __future__ import annotations

import os
import signal
import threading
import warnings
import weakref

import numpy as np
import tensorflow as tf

from keras_replicator import _roles
from keras_replicator._environment import PREEMPTED_FILE
from keras_replicator._replicator_state import replicator_state

__all__ = [
    "Preemption",
    "LocalAgreement",
    "StepAgreement",
    "agree",
    "mark_preempted",
    "signal_numbers",
    "step_agreement",
]

_AGREEMENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Preemption:
    """Records the preemption signals that arrive while it listens.

    Args:
        signals: The signal numbers that mean "preempted" (e.g.
            `(signal.SIGTERM,)`); empty: never listen.

    Attributes:
        received: The number of the first signal that arrived, or None.

    Example:
    >>> import os, signal
    >>> preemption = Preemption([signal.SIGUSR1])
    >>> preemption.listen()
    True
    >>> os.kill(os.getpid(), signal.SIGUSR1)
    >>> preemption.received == signal.SIGUSR1
    True
    >>> preemption.stop_listening()
    """

    def __init__(self, signals=(signal.SIGTERM,)):
        self.signals = tuple(signals)
        self.received = None
        self._previous: dict = {}

    @property
    def listening(self) -> bool:
        return bool(self._previous)

    def listen(self) -> bool:
        """Installs the handler (main thread only: Python's rule); whether it did."""
        if (
            not self.signals
            or threading.current_thread() is not threading.main_thread()
        ):
            return False
        self.received = None
        for number in self.signals:
            self._previous[number] = signal.signal(number, self._record)
        return True

    def stop_listening(self) -> None:
        """Puts back the handlers Python reported before `listen`."""
        for number, previous in self._previous.items():
            signal.signal(number, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    def _record(self, number, frame) -> None:
        if self.received is None:
            self.received = number


class LocalAgreement:
    """One process's answer: stop after the step a signal arrived in.

    The interface `BackupAndRestore` asks after every step; `agree` picks this
    or `StepAgreement`.

    Args:
        preemption: The `Preemption` that listens.

    Example:
    >>> agreement = LocalAgreement(Preemption([]))
    >>> agreement.stop_after_this_step(), agreement.stop_at_epoch_end()
    (False, False)
    """

    def __init__(self, preemption: Preemption):
        self.preemption = preemption

    def stop_after_this_step(self) -> bool:
        """After a step: whether to back up at it and stop."""
        return self.preemption.listening and self.preemption.received is not None

    def stop_at_epoch_end(self) -> bool:
        """At an epoch's end: whether to back up at its last step and stop."""
        return False

    def forget(self) -> None:
        """At an epoch's start: nothing carries over from the epoch before."""

    def end(self) -> None:
        """Stops listening (the handlers Python had come back)."""
        self.preemption.stop_listening()


class StepAgreement(LocalAgreement):
    """The agreement between workers that rides a model's training steps.

    While it is `model`'s (`agree`), the step builder (`keras_integration._steps`)
    passes `local_flag()` into every training step, which averages it with its
    logs and returns the agreed value, and gives that to `record`.

    Args:
        preemption: The `Preemption` whose signal this worker's flag reports.
        model: The model whose training steps carry the flag.
    """

    def __init__(self, preemption: Preemption, model):
        super().__init__(preemption)
        self._model = weakref.ref(model)
        self._flags = (tf.constant(0.0), tf.constant(1.0))
        self._previous = self._latest = None
        _AGREEMENTS[model] = self

    def local_flag(self) -> tf.Tensor:
        """This worker's flag for the step about to run: 1.0 once signalled."""
        return self._flags[self.preemption.received is not None]

    def record(self, agreed) -> None:
        """Keeps the agreed value of the step that just returned (not read)."""
        self._previous, self._latest = self._latest, agreed

    def stop_after_this_step(self) -> bool:
        """After a step: whether the step before it agreed to stop.

        That value was computed before the step that just returned was queued;
        after an epoch's first step there is none (`forget`): False.
        """
        return _agreed(self._previous)

    def stop_at_epoch_end(self) -> bool:
        """At an epoch's end: whether its last step agreed to stop (one read an
        epoch, where Keras reads the epoch's logs anyway)."""
        return _agreed(self._latest)

    def forget(self) -> None:
        """Drops the values read: the agreement never carries over an epoch end."""
        self._previous = self._latest = None

    def end(self) -> None:
        """Stops listening; `model`'s next steps are plain ones."""
        super().end()
        self.forget()
        model = self._model()
        if model is not None and _AGREEMENTS.get(model) is self:
            del _AGREEMENTS[model]


def _agreed(value) -> bool:
    """Whether an agreed flag says stop: anything but exactly 0.

    Every member sends 0 or 1 (`local_flag`), so the mean is 0 only when no
    member was signalled. A value no honest member sends (negative, NaN, inf:
    a member broken or tampered with) stops too rather than hide a signal, as
    "> 0" let NaN and -1 do. (A member sending exactly -1 to cancel one other's
    1 is beyond what a mean can tell apart; that member runs our code anyway.)
    """
    return value is not None and not bool(np.asarray(value) == 0)


def agree(model, preemption: Preemption) -> LocalAgreement:
    """How the workers training `model` agree on a step to stop after.

    Between workers of a multi-worker Replicator while `preemption` listens, in
    the training steps (`StepAgreement`); elsewhere each process for itself. On
    a `ModelParallelReplicator`'s mesh over several workers there is no
    agreement (its steps are DTensor programs, which carry no flag), and a
    worker that stopped alone would leave the others waiting in their next
    collective: `preemption` stops listening, with a warning.
    """
    strategy = model.distribute_strategy
    if preemption.listening and _roles.mesh_spans_workers(strategy):
        preemption.stop_listening()
        warnings.warn(_no_mesh_agreement_message(preemption, strategy), stacklevel=3)
        return LocalAgreement(preemption)
    state = replicator_state(strategy)
    if preemption.listening and state is not None and state.is_multi_worker:
        return StepAgreement(preemption, model)
    return LocalAgreement(preemption)


def _no_mesh_agreement_message(preemption: Preemption, strategy) -> str:
    names = ", ".join(signal.Signals(n).name for n in preemption.signals)
    return (
        f"`preemption_signals` ({names}) cannot be honoured on a "
        f"ModelParallelReplicator whose mesh spans {strategy.num_workers} "
        "workers: its workers cannot agree on a step to stop after (DTensor's "
        "steps carry no agreement), and one that stopped alone would leave the "
        "others waiting in their next collective. This `fit` does not listen "
        "for them: a signal has its usual effect, and a restart resumes from "
        "the last backup. Received: a model under "
        f"{strategy!r}. Pass `preemption_signals=()` to silence this warning."
    )


def step_agreement(model) -> StepAgreement | None:
    """The agreement `model`'s training steps carry now, or None (plain steps)."""
    return _AGREEMENTS.get(model)


def mark_preempted(where: str) -> None:
    """Tells the launcher (if any) that this worker stopped after a preemption.

    Writes `where` (e.g. "epoch 1, after batch 2") to the file named by
    `KERAS_REPLICATOR_PREEMPTED_FILE`; does nothing outside `keras-replicator
    launch`. A failure to write is reported, not raised: the backup is made.

    Example:
    >>> mark_preempted("epoch 0, after batch 1")  # no launcher: nothing to tell
    """
    path = os.environ.get(PREEMPTED_FILE)
    if not path:
        return
    try:
        with open(path, "w") as file:
            file.write(where + "\n")
    except OSError as error:
        print(
            f"keras_replicator: could not tell the launcher about the preemption "
            f"({PREEMPTED_FILE}={path!r}): {error}",
            flush=True,
        )


def signal_numbers(signals) -> tuple:
    """`preemption_signals` as signal numbers; a clear error for anything else.

    Example:
    >>> signal_numbers("SIGTERM") == (signal.SIGTERM,), signal_numbers(None)
    (True, ())
    """
    if signals is None:
        return ()
    if isinstance(signals, (int, str)):
        signals = (signals,)
    numbers = []
    for value in signals:
        try:
            numbers.append(
                int(getattr(signal, value) if isinstance(value, str) else value)
            )
        except (AttributeError, TypeError, ValueError):
            raise ValueError(
                "`preemption_signals` must be signal numbers or names (e.g. "
                f"(signal.SIGTERM,) or 'SIGUSR1'), or None. Received: "
                f"preemption_signals={signals!r}."
            ) from None
    return tuple(numbers)
