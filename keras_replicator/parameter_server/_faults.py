"""Faults under PS training: lost steps of failed workers, and a dead ps.

TensorFlow's `ClusterCoordinator` already tolerates workers that die: the
function a dead worker was running is put back in the queue and run by another
worker, and a worker that comes back is used again. What it does not do is say
so. We count the put-back functions (`_compat.rescheduled_closures`): each one is
a batch of steps whose work was lost and redone (its updates up to the failure
may already have reached the parameter servers; async training accepts that).

A parameter server that dies cannot be tolerated (it held the variables). TF
raises an `UnavailableError` naming `/job:ps`; we raise a `RuntimeError` saying
what happened and what to do, from the chief, after the coordinator has given up.
"""

from __future__ import annotations

import re
import sys

import tensorflow as tf

from keras_replicator import _compat


class Faults:
    """Counts the steps lost to worker failures since it was created or reset."""

    def __init__(self, steps_per_closure: int):
        self.steps_per_closure = steps_per_closure
        self._start = _compat.rescheduled_closures()

    def lost_steps(self) -> int:
        """Steps re-run on other workers since the last `reset()`."""
        return (_compat.rescheduled_closures() - self._start) * self.steps_per_closure

    def reset(self) -> None:
        self._start = _compat.rescheduled_closures()


def report_lost_steps(strategy, lost: int, epoch: int) -> None:
    """Adds to `strategy.lost_steps` and prints one line on the chief."""
    strategy.lost_steps += lost
    print(
        f"keras_replicator: {lost} step(s) of epoch {epoch + 1} were lost with a "
        "failed worker and re-run on the others (training continued).",
        file=sys.stderr,
        flush=True,
    )


def call(function, *args, **kwargs):
    """Calls a coordinator method, turning a parameter-server failure into a
    clear `RuntimeError`."""
    try:
        return function(*args, **kwargs)
    except tf.errors.OpError as error:
        task = _failed_ps(error)
        if task is None:
            raise
        raise RuntimeError(
            f"Parameter server {task} stopped responding, and the job cannot "
            "continue: the model's variables live there. The last checkpoint "
            "written (ModelCheckpoint / BackupAndRestore) is intact; restart the "
            "job to resume from it (`keras-replicator launch --max-restarts 1`). "
            f"TensorFlow reported: {type(error).__name__}: "
            f"{str(error).splitlines()[0][:300]}"
        ) from error


def _failed_ps(error) -> str | None:
    text = str(error)
    if type(error).__name__ == "PSUnavailableError" or "/job:ps" in text:
        found = re.search(r"/job:ps/replica:0/task:(\d+)", text)
        return f"ps {found.group(1)}" if found else "(ps)"
    return None
