"""Preemption: a signal stops `fit` after a step every worker agrees on (issue 38).

Cloud VMs and schedulers announce a preemption with SIGTERM and a grace period.
TensorFlow's multi-worker runtime installs a low-level SIGTERM handler of its own
when the strategy is built, so Python never sees the signal and `fit` trains on
to the end (issue 38). `Preemption.listen` installs a Python handler in its
place while `fit` runs (the one Python saw before comes back after), and it only
records the signal: the step in flight finishes. After each step every worker
says whether it was signalled (`any_worker`, one 4-byte all-reduce), so all of
them stop after the same step, back up at it and exit together: a worker that
stopped alone would leave the others waiting in their next collective.

Hand-written: TensorFlow's `PreemptionCheckpointHandler` does this for custom
training loops only (it saves a `tf.train.Checkpoint` at a step counter of its
own, not Keras 3 `fit`), and Keras has no preemption support.
"""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import tensorflow as tf

from keras_replicator._replicator_state import replicator_state
from keras_replicator._worker_env import PREEMPTED_FILE_ENV

__all__ = ["Preemption", "any_worker", "mark_preempted", "signal_numbers"]


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


def any_worker(strategy, signalled: bool) -> bool:
    """Whether any worker of `strategy` was `signalled`; call on every worker.

    One process (any strategy but a multi-worker Replicator) answers for
    itself. Between workers it is one all-reduce of one value: on the socket
    ring where the strategy opened one, else through the strategy's collectives.

    Example:
    >>> any_worker(tf.distribute.get_strategy(), True)
    True
    """
    state = replicator_state(strategy)
    if state is None or not state.is_multi_worker:
        return bool(signalled)
    flag = np.array([1.0 if signalled else 0.0], np.float32)
    if state.transport is not None:
        return bool(state.transport.all_reduce(flag)[0][0] > 0)

    def reduce():
        context = tf.distribute.get_replica_context()
        return context.all_reduce("sum", tf.constant(flag))

    summed = strategy.experimental_local_results(strategy.run(reduce))[0]
    return bool(summed.numpy()[0] > 0)


def mark_preempted(where: str) -> None:
    """Tells the launcher (if any) that this worker stopped after a preemption.

    Writes `where` (e.g. "epoch 1, after batch 2") to the file named by
    `KERAS_REPLICATOR_PREEMPTED_FILE`; does nothing outside `keras-replicator
    launch`. A failure to write is reported, not raised: the backup is made.

    Example:
    >>> mark_preempted("epoch 0, after batch 1")  # no launcher: nothing to tell
    """
    path = os.environ.get(PREEMPTED_FILE_ENV)
    if not path:
        return
    try:
        with open(path, "w") as file:
            file.write(where + "\n")
    except OSError as error:
        print(
            f"keras_replicator: could not tell the launcher about the preemption "
            f"({PREEMPTED_FILE_ENV}={path!r}): {error}",
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
