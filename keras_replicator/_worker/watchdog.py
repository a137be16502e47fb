"""Worker-side watchdog: a task that must not outlive its launcher ends with it.

Serving tasks of a parameter-server job (`worker`, `ps`) block until someone
stops them; if their launcher is SIGKILLed they would serve forever, listening on
all interfaces. The launcher's reaper (`launch/_reaper.py`) stops them from outside;
this watchdog is the inside half, for when the reaper died too (a
`kill -9 -- -PGID` of the launcher's group, a container runtime killing
everything but the workers' sessions).

The launcher exports its pid as `KERAS_REPLICATOR_LAUNCHER_PID` to every worker.
`exit_with_launcher()` starts a daemon thread that polls it: when the process was
started by the launcher directly, a change of `os.getppid()` (the orphan is
re-parented) is the signal, which cannot be fooled by pid reuse; otherwise (a
shell between them) whether the launcher's pid still exists. When it is gone, the
watchdog sends SIGTERM to its own process, so the task's own SIGTERM handler
runs (the serving code exits 0 there), and ends the process with
`EXIT_ORPHANED` if that has not happened after `grace_seconds`.

Polling rather than Linux's `prctl(PR_SET_PDEATHSIG)`: that fires when the
*thread* that started the worker exits, not the launcher process, it is Linux
only, and it must be set in the child between fork and exec, which Python only
offers through `preexec_fn` (unsafe with the launcher's reader threads).

Imports nothing but the standard library, so TensorFlow tasks can call it early.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from keras_replicator._environment import LAUNCHER_PID

EXIT_ORPHANED = 3


def exit_with_launcher(
    poll_seconds: float = 1.0,
    grace_seconds: float = 10.0,
    *,
    environ=None,
) -> bool:
    """Ends this process (SIGTERM to itself, then exit) when its launcher is gone.

    Call it once, early, in a task that serves until stopped. Outside a launcher
    (`KERAS_REPLICATOR_LAUNCHER_PID` unset) it does nothing.

    Args:
        poll_seconds: How often to check the launcher. Defaults to `1.0`.
        grace_seconds: Seconds the process's own SIGTERM handling may take before
            it is ended with exit code `EXIT_ORPHANED` (3). Defaults to `10.0`.
        environ: Where to read the launcher's pid. Defaults to `None`:
            `os.environ`.

    Returns:
        Whether a watchdog was started.

    Example:
    >>> exit_with_launcher(environ={})  # not started by a launcher
    False
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(LAUNCHER_PID, "")
    if not raw.isascii() or not raw.isdigit() or int(raw) <= 1:
        return False
    launcher = int(raw)
    parent = os.getppid()
    thread = threading.Thread(
        target=_watch,
        args=(launcher, parent == launcher, poll_seconds, grace_seconds),
        name="keras-replicator-launcher-watchdog",
        daemon=True,
    )
    thread.start()
    return True


def launcher_alive(launcher: int, is_parent: bool) -> bool:
    """Whether the launcher with pid `launcher` still runs (see the module doc)."""
    if is_parent:
        return os.getppid() == launcher
    try:
        os.kill(launcher, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process has the pid now: ours is gone
    return True


def _watch(launcher, is_parent, poll_seconds, grace_seconds):
    while launcher_alive(launcher, is_parent):
        time.sleep(poll_seconds)
    try:
        print(
            f"keras_replicator: the launcher (pid {launcher}) is gone; this task "
            f"(pid {os.getpid()}) stops too.",
            file=sys.stderr,
            flush=True,
        )
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_seconds)
    os._exit(EXIT_ORPHANED)
