"""Stopping a group's processes: SIGTERM, a grace period, then SIGKILL.

Every worker leads a process group of its own (`_runner._start`), so a signal
to the group also reaches what the worker started. The routine is the same for
every group the launcher runs, and for every reason it stops one (a failed
worker, the deadline, a resize, the chief of a parameter-server job exiting, a
signal to the launcher): nothing may skip the SIGKILL, or a worker that ignores
SIGTERM would outlive its launcher.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from keras_replicator.launch._reaper import REAPER
from keras_replicator.launch._signals import signals_deferred

_REAP_SECONDS = 5.0  # after SIGKILL; see `_reap`


def stop(processes, grace_seconds) -> set[int]:
    """SIGTERM every live worker's process group, then SIGKILL what remains.

    Nothing skips the SIGKILL: an exception during the grace period (a second
    Ctrl-C under Python's default handler) sends it at once, then propagates.
    Returns the positions of the workers it had to stop.
    """
    # A first signal arriving now is raised once the workers are stopped.
    with signals_deferred():
        live = {i: p for i, p in enumerate(processes) if p.poll() is None}
        for process in live.values():
            _signal_group(process, signal.SIGTERM)
        end = time.monotonic() + grace_seconds
        try:
            for process in live.values():
                try:
                    process.wait(timeout=max(0.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            for process in live.values():
                if process.poll() is None:
                    _signal_group(process, signal.SIGKILL)
            for process in live.values():
                _reap(process)
            for process in processes:
                REAPER.forget(process.pid)
    return set(live)


def _reap(process) -> None:
    """`process.wait()` after SIGKILL, which cannot hang.

    With Python's own handlers, a `KeyboardInterrupt` can land in `poll()` just
    after it took the process's wait lock, leaving the lock taken: `wait()`
    would block on it for ever. So wait a bounded time, then reap directly.
    """
    try:
        process.wait(timeout=_REAP_SECONDS)
    except subprocess.TimeoutExpired:
        try:
            _, status = os.waitpid(process.pid, 0)
        except ChildProcessError:  # reaped after all
            return
        process.returncode = os.waitstatus_to_exitcode(status)


def _signal_group(process, sig):
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
