"""Supervising a parameter-server job: the chief decides, workers may rejoin.

A parameter-server job is not a group of peers: the chief runs the training and
the workers and parameter servers serve it (constructing the strategy on them
serves and blocks). So the rules differ from `run_group`'s:

- The job ends when the chief exits; its exit code is the job's. The launcher then
  sends SIGTERM to the serving tasks, which exit 0 (`parameter_server/_serving.py`).
- A worker that exits on its own is restarted with the same `TF_CONFIG` (same
  port), up to `max_rejoins` times per worker; the chief's `ClusterCoordinator`
  re-runs its lost steps on the others meanwhile and uses it again when it is back.
- A parameter server that dies is not restarted (the variables died with it): the
  chief fails with a clear error within the coordinator's failure detection, or
  the launcher stops the job after `ps_failure_grace` seconds.
- Signals, output, the reaper and the stop routine are `run_group`'s
  (`_runner.py`): serving tasks never outlive the launcher.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping, Sequence

from keras_replicator.launch._output import Echo, note
from keras_replicator.launch._reaper import REAPER
from keras_replicator.launch._results import LaunchResult, WorkerResult
from keras_replicator.launch._runner import (
    _TAIL_LINES,
    WorkerSpec,
    _read,
    _start,
    _stop,
)
from keras_replicator.launch._signals import signals_deferred

_POLL_SECONDS = 0.05
_REJOIN_DELAY_SECONDS = 1.0


def run_ps_group(
    command: Sequence[str],
    specs: Sequence[WorkerSpec],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    echo: bool = True,
    grace_seconds: float = 5.0,
    max_rejoins: int = 0,
    ps_failure_grace: float = 180.0,
) -> LaunchResult:
    """Runs one PS job (specs labelled `chief`, `worker i`, `ps i`) to the end."""
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    kinds = [(spec.label or "").split(" ")[0] for spec in specs]
    chief = kinds.index("chief")
    processes = []
    tails = [collections.deque(maxlen=_TAIL_LINES) for _ in specs]
    exits: list[float | None] = [None] * len(specs)
    rejoins = [0] * len(specs)
    readers = []
    output = Echo(echo)
    timed_out = False
    ps_died_at = None

    def start(position):
        with signals_deferred():
            process = _start(command, specs[position], env, cwd, grace_seconds)
            if position < len(processes):
                REAPER.forget(processes[position].pid)  # exited and reaped
                processes[position] = process
            else:
                processes.append(process)
            readers.append(
                _read(process, specs[position].prefix, tails[position], output)
            )

    try:
        for position in range(len(specs)):
            start(position)
        while True:
            with signals_deferred():  # never inside `poll()` (see `_signals.py`)
                now = time.monotonic()
                if processes[chief].poll() is not None:
                    exits[chief] = now - started
                    break
                for position, process in enumerate(processes):
                    if position == chief or process.poll() is None:
                        continue
                    if kinds[position] == "worker" and rejoins[position] < max_rejoins:
                        rejoins[position] += 1
                        _note(
                            echo,
                            f"{specs[position].label} exited with code "
                            f"{process.returncode}; restarting it to rejoin the job "
                            f"({rejoins[position]} of {max_rejoins}).",
                        )
                        time.sleep(_REJOIN_DELAY_SECONDS)
                        start(position)
                        continue
                    if exits[position] is None:
                        exits[position] = now - started
                        if kinds[position] == "ps":
                            ps_died_at = now
                            _note(
                                echo,
                                f"{specs[position].label} exited with code "
                                f"{process.returncode}; the chief will fail (its "
                                "variables are gone).",
                            )
                if ps_died_at is not None and now - ps_died_at > ps_failure_grace:
                    break
                if deadline is not None and now > deadline:
                    timed_out = True
                    break
            time.sleep(_POLL_SECONDS)
    finally:
        stopped = _stop(processes, grace_seconds)
        now = time.monotonic() - started
        for position in range(len(processes)):
            if exits[position] is None:
                exits[position] = now
        for reader in readers:
            reader.join(timeout=5)
    return LaunchResult(
        workers=tuple(
            WorkerResult(
                spec.index,
                process.returncode,
                "".join(tails[position]),
                seconds=exits[position],
                stopped=position in stopped,
                label=spec.label,
                address=spec.address,
            )
            for position, (spec, process) in enumerate(zip(specs, processes))
        ),
        timed_out=timed_out,
        seconds=time.monotonic() - started,
        job_index=chief,
        rejoins=sum(rejoins),
    )


def _note(echo, message):
    if echo:
        note(message)
