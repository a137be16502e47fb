"""The one supervisor of worker processes: start, poll, stop, report.

Every group the launcher runs goes through `supervise`: a group of peers
(`_runner.run_group`: the first failure stops the others) and a parameter-server
job (`_ps_runner.run_ps_group`: the chief decides, workers rejoin). What differs
between them is a small `GroupRules` object (when the run is over, whether to
stop it early, what its result says); what is the same is here:

- Each worker leads a process group (session) of its own, so that stopping it
  also stops what it started and a Ctrl-C in the terminal reaches the launcher
  only; it is registered with the reaper (`_reaper.py`), which stops it if the
  launcher dies without doing so, and gets `KERAS_REPLICATOR_LAUNCHER_PID` for
  its own watchdog (`keras_replicator/_worker/watchdog.py`).
- Every line a worker prints is echoed with its label (`[worker 1] ...`), in
  chunks of at most 8 KiB, and a closed stdout stops the echo, not the job
  (`_output.py`); the last lines are kept for the result.
- The processes are polled with signals deferred (never inside `poll()`,
  `_signals.py`); at the end whatever still runs is stopped: SIGTERM to its
  process group, SIGKILL after the grace (`_stopping.py`), which no exception
  (a second Ctrl-C) can skip.

Imports no TensorFlow, so the parent stays light and never grabs devices.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from keras_replicator._environment import LAUNCHER_PID
from keras_replicator.launch._output import Echo, pump
from keras_replicator.launch._reaper import REAPER
from keras_replicator.launch._results import LaunchResult, WorkerResult
from keras_replicator.launch._signals import signals_deferred
from keras_replicator.launch._stopping import stop

_TAIL_LINES = 200
_POLL_SECONDS = 0.05


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """One worker to start: its index, label, TF_CONFIG and extra environment.

    `command` replaces the group's command for this task (service tasks).
    """

    index: int
    tf_config: str | None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    label: str | None = None
    command: tuple[str, ...] | None = None

    @property
    def prefix(self) -> str:
        return f"[{self.label or f'worker {self.index}'}] "

    @property
    def address(self) -> tuple[str, str] | None:
        """`(TF_CONFIG field, "host:port")` of this task's own server, if known.

        For a service task, `("--port", "127.0.0.1:PORT")` from its command.
        """
        if self.command and "--port" in self.command:
            port = self.command[self.command.index("--port") + 1]
            return ("--port", f"127.0.0.1:{port}")
        if self.tf_config is None:
            return None
        try:
            config = json.loads(self.tf_config)
            kind, index = config["task"]["type"], config["task"]["index"]
            return (
                f"TF_CONFIG['cluster']['{kind}'][{index}]",
                config["cluster"][kind][index],
            )
        except (TypeError, ValueError, KeyError, IndexError):
            return None


class GroupRules(Protocol):
    """What differs between two kinds of group `supervise` runs.

    A group of peers (`run_group`) ends when its workers are done or one fails; a
    parameter-server job (`_ps_runner.py`) when its chief exits, restarting
    workers meanwhile. Starting, polling, the deadline, stopping and the output
    are the same for both and stay in `supervise`.
    """

    stop_grace: float | None  # the grace when `interrupts` stopped the group

    def ended(self, group: RunningGroup, now: float) -> bool:
        """Asked every poll at `time.monotonic()` `now`: whether the run is over.

        May record exits and start a process again (`group.start`).
        """

    def interrupts(self, group: RunningGroup) -> bool:
        """Asked every poll after the deadline: whether to stop the group now."""

    def result(
        self, group: RunningGroup, stopped: set[int], timed_out: bool, interrupted: bool
    ) -> LaunchResult:
        """The run's result, once every process was stopped or exited."""


class RunningGroup:
    """The processes of one run, their output tails and exit times.

    Position `i` is `specs[i]`'s process (`processes[i]`, the latest one when it
    was started again), `tails[i]` the end of its output and `exits[i]` when it
    exited, in seconds after `started` (`None` while it runs).
    """

    def __init__(self, command, specs, env, cwd, echo: bool, grace_seconds: float):
        self.specs = list(specs)
        self.started = time.monotonic()
        self.processes: list[subprocess.Popen] = []
        self.tails: list[collections.deque[str]] = [
            collections.deque(maxlen=_TAIL_LINES) for _ in self.specs
        ]
        self.exits: list[float | None] = [None] * len(self.specs)
        self._launch = (command, env, cwd, grace_seconds)
        self._readers: list[threading.Thread] = []
        self._output = Echo(echo)

    def start(self, position: int) -> None:
        """Starts `specs[position]`'s process (again, if it ran before)."""
        command, env, cwd, grace_seconds = self._launch
        spec = self.specs[position]
        with signals_deferred():
            process = _start(command, spec, env, cwd, grace_seconds)
            if position < len(self.processes):
                REAPER.forget(self.processes[position].pid)  # exited and reaped
                self.processes[position] = process
            else:
                self.processes.append(process)
            self._readers.append(
                _read(process, spec.prefix, self.tails[position], self._output)
            )

    def record_exits(self, now: float) -> None:
        """Notes, at `time.monotonic()` `now`, which processes have exited."""
        for position, process in enumerate(self.processes):
            if self.exits[position] is None and process.poll() is not None:
                self.exits[position] = now - self.started

    def finish(self) -> None:
        """Once all are stopped: exit times for the rest, the output drained."""
        now = time.monotonic() - self.started
        for position in range(len(self.processes)):
            if self.exits[position] is None:
                self.exits[position] = now
        for reader in self._readers:
            reader.join(timeout=5)

    def results(
        self,
        stopped: set[int],
        labelled: Callable[[int], bool],
        preempted: Callable[[WorkerSpec], bool] | None = None,
    ) -> tuple[WorkerResult, ...]:
        """One `WorkerResult` per process.

        `labelled(position)`: whether it keeps its spec's label; `preempted(spec)`:
        whether it said it stopped after a preemption backup.
        """
        return tuple(
            WorkerResult(
                spec.index,
                process.returncode,
                "".join(self.tails[position]),
                seconds=self.exits[position],
                stopped=position in stopped,
                label=spec.label if labelled(position) else None,
                address=spec.address,
                preempted=preempted is not None and preempted(spec),
            )
            for position, (spec, process) in enumerate(zip(self.specs, self.processes))
        )


def supervise(
    command: Sequence[str],
    specs: Sequence[WorkerSpec],
    rules: GroupRules,
    *,
    timeout: float | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    echo: bool,
    grace_seconds: float,
) -> LaunchResult:
    """Runs one group to its end: start every spec, poll, stop what still runs.

    `rules` say, every poll, whether the run is over (else the deadline may end
    it, then `rules` may stop it early) and, at the end, what its result is.
    Whatever still runs then gets SIGTERM, and SIGKILL after `grace_seconds`
    (`rules.stop_grace` when the rules stopped it early).
    """
    group = RunningGroup(command, specs, env, cwd, echo, grace_seconds)
    deadline = None if timeout is None else group.started + timeout
    timed_out = interrupted = False
    stopped: set[int] = set()
    try:
        for position in range(len(group.specs)):
            group.start(position)
        while True:
            # A signal lands in the sleep, or at the end of this block: never in
            # `poll()` between taking the process's lock and its `try:` (a lock
            # left taken hangs `stop`'s `wait()`), see `_signals.py`.
            with signals_deferred():
                if rules.ended(group, time.monotonic()):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    break
                if rules.interrupts(group):
                    interrupted = True
                    break
            time.sleep(_POLL_SECONDS)
    finally:
        if interrupted and rules.stop_grace is not None:
            grace_seconds = rules.stop_grace
        stopped.update(stop(group.processes, grace_seconds))
        group.finish()
    return rules.result(group, stopped, timed_out, interrupted)


def _start(command, spec: WorkerSpec, env, cwd, grace_seconds=5.0):
    """Starts one worker, leader of a new session, registered with the reaper."""
    worker_env = dict(os.environ)
    worker_env.update(env or {})
    worker_env.update(spec.env)
    if spec.tf_config is not None:
        worker_env["TF_CONFIG"] = spec.tf_config
    worker_env.setdefault("PYTHONUNBUFFERED", "1")
    worker_env[LAUNCHER_PID] = str(os.getpid())
    # A session of its own, so that stopping a worker also stops its children
    # and a Ctrl-C in the terminal reaches the launcher only (which then stops
    # every worker in order). Bytes, read in bounded chunks (`_output.py`).
    process = subprocess.Popen(
        list(spec.command or command),
        env=worker_env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    REAPER.watch(process.pid, grace_seconds)
    return process


def _read(process, prefix, tail, output: Echo) -> threading.Thread:
    """Starts the thread that drains `process`'s output into `tail` and `output`."""
    reader = threading.Thread(
        target=pump, args=(process.stdout, prefix, tail, output), daemon=True
    )
    reader.start()
    return reader
