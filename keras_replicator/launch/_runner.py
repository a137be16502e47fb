"""Starts a group of worker processes and supervises them until the group is done.

The one process runner of the project: `keras-replicator launch`, `launch()`,
`launch_function()`, the conformance suite's multi-worker cases and the tests all
start workers here. It imports no TensorFlow, so the parent stays light and never
grabs devices.

Supervision rules:

- Every line a worker prints is echoed with its label (`[worker 1] ...`), in
  chunks of at most 8 KiB, and a closed stdout stops the echo, not the job
  (`_output.py`).
- The first worker to exit non-zero (or the deadline) stops the others: SIGTERM to
  each worker's process group, SIGKILL after `grace_seconds`. A worker that exits 0
  is left alone, so a slow chief can still write its final checkpoint. No
  exception (a second Ctrl-C) can skip the SIGKILL: it comes at once instead.
- Each worker leads a process group of its own, registered with the reaper
  (`_reaper.py`), which stops it if the launcher dies without doing so; workers
  get `KERAS_REPLICATOR_LAUNCHER_PID` for their own watchdog
  (`keras_replicator/_watchdog.py`).
- Service tasks (`services`: the tf.data service dispatcher and workers of
  `--data-service-workers`) start first, serve the workers and are stopped with
  the same routine once every worker has exited; one that exits on its own
  before then (any exit code) fails the group like a failed worker.
- `stop_when` (the elastic launcher's resize) is asked every poll; when it
  answers True the workers are stopped like a deadline stops them (SIGTERM, which
  `BackupAndRestore` turns into a backup at an agreed step and an exit with 0),
  but with a grace of its own (`stop_when_grace`: a backup can take longer than
  a shutdown), and the result says `interrupted`.
- The result keeps, for every worker, its exit code, when it exited, whether the
  launcher stopped it, and the tail of its output. `first_failure` is the worker
  that failed first *in time* and on its own, which is the one to blame: the others
  usually fail because it did.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from keras_replicator._tf_config import format_address, validate_tf_config
from keras_replicator._watchdog import LAUNCHER_PID_ENV
from keras_replicator._worker_env import PREEMPTED_FILE_ENV
from keras_replicator.launch._output import Echo, pump
from keras_replicator.launch._ports import free_ports
from keras_replicator.launch._reaper import REAPER
from keras_replicator.launch._results import LaunchResult, WorkerResult
from keras_replicator.launch._signals import signals_deferred

_TAIL_LINES = 200
_POLL_SECONDS = 0.05
_REAP_SECONDS = 5.0  # after SIGKILL; see `_reap`


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


def tf_configs(num_workers: int, host: str = "127.0.0.1", ports=None) -> list[dict]:
    """One TF_CONFIG dict per worker, all on `host` with free (or given) ports.

    Example:
    >>> from keras_replicator.launch import tf_configs
    >>> tf_configs(2, ports=[5000, 5001])[1]["task"]
    {'type': 'worker', 'index': 1}
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int):
        raise TypeError(
            f"`num_workers` must be an integer. Received: num_workers={num_workers!r}."
        )
    if num_workers < 1:
        raise ValueError(
            f"`num_workers` must be at least 1. Received: num_workers={num_workers}. "
            "Use `num_workers=2` (`-n 2`) or more for a multi-worker run."
        )
    ports = list(ports) if ports is not None else free_ports(num_workers, host)
    if len(ports) != num_workers:
        raise ValueError(
            f"`ports` must list one port per worker ({num_workers}). "
            f"Received: ports={ports}."
        )
    cluster = {"worker": [format_address(host, port) for port in ports]}
    configs = [
        {"cluster": cluster, "task": {"type": "worker", "index": index}}
        for index in range(num_workers)
    ]
    validate_tf_config(configs[0])  # e.g. a host with a space, or a repeated port
    return configs


def run_workers(
    command: Sequence[str],
    num_workers: int,
    *,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    host: str = "127.0.0.1",
    ports: Sequence[int] | None = None,
    echo: bool = True,
    grace_seconds: float = 5.0,
) -> LaunchResult:
    """Runs `command` as `num_workers` workers of one cluster and waits for them.

    One run, no restarts (see `launch()` for those). Each worker gets a `TF_CONFIG`
    naming every worker's `host:port`, and `KERAS_REPLICATOR_WORKER_INDEX` /
    `KERAS_REPLICATOR_NUM_WORKERS`.

    Args:
        command: The program and its arguments, e.g. `["python", "train.py"]`.
        num_workers: How many worker processes to start.
        timeout: Seconds before all workers are stopped. Defaults to `None` (none).
        env: Extra environment variables for every worker. Defaults to `None`.
        cwd: Working directory of the workers. Defaults to `None` (this one's).
        host: Address the workers advertise in `TF_CONFIG`. Defaults to
            `"127.0.0.1"`.
        ports: One port per worker. Defaults to `None` (free ports).
        echo: Print each worker's output, prefixed `[worker i]`. Defaults to `True`.
        grace_seconds: Seconds between SIGTERM and SIGKILL when stopping workers.
            Defaults to `5.0`.

    Returns:
        A `LaunchResult` with each worker's exit code and output tail.

    Example:
    >>> import sys
    >>> from keras_replicator.launch import run_workers
    >>> result = run_workers([sys.executable, "-c", "print('hi')"], 2, echo=False)
    >>> result.ok, result.workers[1].output.strip()
    (True, 'hi')
    """
    if not command:
        raise ValueError(
            "`command` must name a program to run. Received: command=[]. "
            'Use e.g. command=["python", "train.py"].'
        )
    configs = tf_configs(num_workers, host=host, ports=ports)
    specs = [
        WorkerSpec(
            index=index,
            tf_config=json.dumps(config),
            env={
                "KERAS_REPLICATOR_WORKER_INDEX": str(index),
                "KERAS_REPLICATOR_NUM_WORKERS": str(num_workers),
            },
        )
        for index, config in enumerate(configs)
    ]
    return run_group(
        command,
        specs,
        timeout=timeout,
        env=env,
        cwd=cwd,
        echo=echo,
        grace_seconds=grace_seconds,
    )


def run_group(
    command: Sequence[str],
    specs: Sequence[WorkerSpec],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    echo: bool = True,
    grace_seconds: float = 5.0,
    services: Sequence[WorkerSpec] = (),
    stop_when: Callable[[], bool] | None = None,
    stop_when_grace: float | None = None,
) -> LaunchResult:
    """Starts one process per spec and supervises them (see the module docstring).

    `services` are started first and stopped when every spec's process exited.
    `stop_when`, asked every poll, stops the workers when it returns True, with
    `stop_when_grace` seconds (default `grace_seconds`) before the SIGKILL.
    """
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    everything = list(services) + list(specs)
    processes: list[subprocess.Popen] = []
    tails: list[collections.deque[str]] = [
        collections.deque(maxlen=_TAIL_LINES) for _ in everything
    ]
    exits: list[float | None] = [None] * len(everything)
    stopped: set[int] = set()
    readers = []
    output = Echo(echo)
    timed_out = interrupted = False
    first = len(services)  # position of the first worker in `everything`
    try:
        for position, spec in enumerate(everything):
            with signals_deferred():
                processes.append(_start(command, spec, env, cwd, grace_seconds))
                readers.append(
                    _read(processes[-1], spec.prefix, tails[position], output)
                )
        while True:
            # A signal lands in the sleep, or at the end of this block: never in
            # `poll()` between taking the process's lock and its `try:` (a lock
            # left taken hangs `_stop`'s `wait()`), see `_signals.py`.
            with signals_deferred():
                now = time.monotonic() - started
                for position, process in enumerate(processes):
                    if exits[position] is None and process.poll() is not None:
                        exits[position] = now
                codes = [p.returncode for p in processes[first:]]
                if all(code is not None for code in codes):
                    break
                if any(code not in (None, 0) for code in codes):
                    break
                if any(p.returncode is not None for p in processes[:first]):
                    break  # a service task left before the workers were done
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    break
                # Once a worker is done (exit 0), the group is ending: no resize.
                if stop_when is not None and all(c is None for c in codes):
                    if stop_when():
                        interrupted = True
                        break
            time.sleep(_POLL_SECONDS)
    finally:
        if interrupted and stop_when_grace is not None:
            grace_seconds = stop_when_grace
        stopped.update(_stop(processes, grace_seconds))
        now = time.monotonic() - started
        for position in range(len(processes)):
            if exits[position] is None:
                exits[position] = now
        for reader in readers:
            reader.join(timeout=5)
    results = tuple(
        WorkerResult(
            spec.index,
            process.returncode,
            "".join(tails[position]),
            seconds=exits[position],
            stopped=position in stopped,
            label=spec.label if position < first else None,
            address=spec.address,
            preempted=_preempted(spec),
        )
        for position, (spec, process) in enumerate(zip(everything, processes))
    )
    return LaunchResult(
        workers=results[first:],
        timed_out=timed_out,
        interrupted=interrupted,
        seconds=time.monotonic() - started,
        services=results[:first],
    )


def _preempted(spec: WorkerSpec) -> bool:
    """Whether the worker said it stopped after a preemption backup."""
    path = spec.env.get(PREEMPTED_FILE_ENV)
    return path is not None and os.path.exists(path)


def _start(command, spec: WorkerSpec, env, cwd, grace_seconds=5.0):
    """Starts one worker, leader of a new session, registered with the reaper."""
    worker_env = dict(os.environ)
    worker_env.update(env or {})
    worker_env.update(spec.env)
    if spec.tf_config is not None:
        worker_env["TF_CONFIG"] = spec.tf_config
    worker_env.setdefault("PYTHONUNBUFFERED", "1")
    worker_env[LAUNCHER_PID_ENV] = str(os.getpid())
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


def _stop(processes, grace_seconds) -> set[int]:
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
