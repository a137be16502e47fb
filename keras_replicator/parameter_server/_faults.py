"""Faults under PS training: a dead or hung task.

TensorFlow's `ClusterCoordinator` already tolerates workers that die: the
function a dead worker was running is put back in the queue and run by another
worker (TensorFlow logs the failure), and a worker that comes back is used again.

A parameter server that dies cannot be tolerated (it held the variables). TF
raises an `UnavailableError` naming `/job:ps`; we raise a `RuntimeError` saying
what happened and what to do, from the chief, after the coordinator has given up.

A task that hangs (SIGSTOP, a deadlock, a host that drops packets) is not an
error to TF: its connections stay open and `coordinator.join()` waits forever.
`wait()` replaces `join()` with a deadline on *progress*: if the coordinator's
queue and in-flight closures do not change for `KERAS_REPLICATOR_PS_TIMEOUT`
seconds (default 60, like the collectives' timeout), it probes every worker and
ps with a trivial op and raises a `TimeoutError` naming the tasks that did not
answer. Progress, not total time, so a long epoch is never cut short; only a
single scheduled function (`steps_per_execution` steps) longer than the timeout
is. The queue's counters are private (`_CoordinatedClosureQueue`): if a TF
release renames them, `wait()` falls back to a plain `join()`.
"""

from __future__ import annotations

import atexit
import os
import re
import socket
import sys
import threading
import time

import tensorflow as tf

from keras_replicator import _compat
from keras_replicator._environment import PS_TIMEOUT
from keras_replicator._replicator_state import replicator_state


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


DEFAULT_TIMEOUT = 60.0
PROBE_SECONDS = 5.0


def timeout_seconds() -> float:
    """Seconds without progress before `wait` gives up.

    `KERAS_REPLICATOR_PS_TIMEOUT` if set, else 60.
    """
    raw = os.environ.get(PS_TIMEOUT)
    if raw is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(
            f"`{PS_TIMEOUT}` must be a positive number of seconds "
            f"('inf' waits forever). Received: {PS_TIMEOUT}={raw!r}."
        )
    return value


def wait(strategy, what: str) -> None:
    """`coordinator.join()` that raises `TimeoutError` when no closure progresses.

    Args:
        strategy: The `ParameterServerReplicator` whose coordinator to wait on.
        what: What the chief was waiting for, for the message (e.g. "epoch 3 of
            fit").

    Example:
    >>> wait(strategy, "epoch 1 of fit")  # doctest: +SKIP
    """
    coordinator = strategy.coordinator
    limit = timeout_seconds()
    state = _queue_state(coordinator)
    if state is None or limit == float("inf"):
        call(coordinator.join)
        return
    changed = time.monotonic()
    pause = 0.001
    while not call(coordinator.done):
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
        now = _queue_state(coordinator)
        if now != state:
            state, changed, pause = now, time.monotonic(), 0.001
        elif time.monotonic() - changed > limit:
            message = _hang_message(strategy, limit, what)
            _cancel(coordinator)
            raise TimeoutError(message)
    call(coordinator.join)


def _cancel(coordinator) -> None:
    """Cancels the closures and makes this process exit without TF's teardown.

    At exit, TensorFlow removes every traced function from every task's eager
    context, one RPC per task, with no deadline: with a hung task that waits
    forever, so the chief would hang after all. An `atexit` hook (run before
    that teardown) flushes the output and ends the process with `os._exit`.
    `os._exit` needs the exit code, which Python does not tell `atexit` hooks,
    so `sys.exit` is wrapped from here on to record it: a script that catches
    this `TimeoutError` and calls `sys.exit(3)` exits with 3. An uncaught error
    exits with 1, a normal end with 0 (a bare `raise SystemExit(3)` bypasses
    the wrapper and also exits with 0).
    """
    _compat.stop_coordinator(coordinator)
    if not _exit_status:
        _record_exit_status()
        atexit.register(_exit_without_teardown)


_exit_status: list = []


def _record_exit_status() -> None:
    original = sys.exit

    def exit(status=None):
        _exit_status[:] = [True, status]
        original(status)

    exit.__doc__ = original.__doc__
    _exit_status[:] = [False, None]
    sys.exit = exit


def exit_code(status_recorded: bool, status, uncaught) -> int:
    """The code Python would exit with (see `_cancel`).

    Args:
        status_recorded: Whether `sys.exit` was called.
        status: Its argument.
        uncaught: The uncaught exception that ended the program, or None.

    Example:
    >>> exit_code(True, 3, None)
    3
    """
    if uncaught is not None and not isinstance(uncaught, SystemExit):
        return 1
    if not status_recorded or status is None:
        return 0
    if isinstance(status, int):
        return int(status) & 0xFF
    return 1  # sys.exit("message"): Python printed it; the code is 1.


def _exit_without_teardown() -> None:
    recorded, status = _exit_status or (False, None)
    code = exit_code(recorded, status, getattr(sys, "last_value", None))
    print(
        "keras_replicator: exiting without TensorFlow's teardown, which would wait "
        f"forever for the hung task (exit code {code}).",
        file=sys.stderr,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _queue_state(coordinator):
    return _compat.closure_queue_state(coordinator)


def _hang_message(strategy, limit, what) -> str:
    silent = unresponsive_tasks(strategy)
    if silent:
        named = ", ".join(silent)
        verb = "does" if len(silent) == 1 else "do"
        who = f"{named} {verb} not respond"
    else:
        who = "every task still answers a probe, so a step itself is stuck"
    advice = (
        "A hung parameter server holds the variables: the job cannot continue."
        if any(task.startswith("ps") for task in silent)
        else "A hung worker keeps the steps it holds: kill it (the coordinator "
        "then re-runs them on the other workers) or restart the job."
    )
    return (
        f"No scheduled step finished or started for {limit:g} s while the chief "
        f"waited for {what}: {who} (stopped, deadlocked or unreachable). {advice} "
        "The last checkpoint written (ModelCheckpoint / BackupAndRestore) is "
        "intact; restart the job to resume from it (`keras-replicator launch "
        "--max-restarts 1`). If one scheduled function (steps_per_execution "
        f"steps) legitimately takes longer, raise {PS_TIMEOUT} "
        f"(now {limit:g} s)."
    )


def unresponsive_tasks(strategy, seconds: float = PROBE_SECONDS) -> list[str]:
    """Workers and ps whose gRPC server does not greet us within `seconds`.

    A probe opens a TCP connection to the task's address and sends the HTTP/2
    client preface; a live gRPC server answers with its SETTINGS frame at once,
    a stopped or hung process never does (its kernel still accepts the
    connection). Hand-written with `socket` because probing through TensorFlow
    (an eager op on the task) blocks while holding the GIL when the task is
    hung, which freezes the chief.

    Returns:
        Task names that did not answer, e.g. `["ps 0"]`.
    """
    state = replicator_state(strategy)
    resolver = state.resolver if state is not None else strategy.cluster_resolver
    cluster = resolver.cluster_spec().as_dict()
    answered = {}

    def probe(name, address):
        answered[name] = _greets(address, seconds)

    threads = []
    for job in ("worker", "ps"):
        for index, address in enumerate(cluster.get(job, [])):
            name = f"{job} {index}"
            thread = threading.Thread(target=probe, args=(name, address), daemon=True)
            thread.start()
            threads.append((name, thread))
    deadline = time.monotonic() + seconds + 1.0
    for _, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [name for name, _ in threads if not answered.get(name)]


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(
    [0, 0, 0, 4, 0, 0, 0, 0, 0]
)


def _greets(address: str, seconds: float) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), seconds) as link:
            link.settimeout(seconds)
            link.sendall(_HTTP2_PREFACE)
            return len(link.recv(9)) > 0
    except (OSError, ValueError):
        return False
