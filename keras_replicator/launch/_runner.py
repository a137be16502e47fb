"""Starts N worker processes with a TF_CONFIG each and supervises them.

The one process runner of the project: the `keras-replicator launch` command, the
conformance suite's multi-worker cases and the tests all use it. It imports no
TensorFlow, so the parent stays light and never grabs devices.

Supervision rules: output lines are prefixed with the worker index; the first worker
to exit non-zero (or the deadline) stops the others (SIGTERM, then SIGKILL after a
grace period); the result keeps every worker's exit code and the tail of its output,
so the failing worker's traceback can be shown.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from keras_replicator.launch._ports import free_ports

_TAIL_LINES = 200


@dataclasses.dataclass(frozen=True)
class WorkerResult:
    """What one worker did: its index, exit code and last lines of output."""

    index: int
    returncode: int | None
    output: str


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    """The outcome of one launch of all workers."""

    workers: tuple[WorkerResult, ...]
    timed_out: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(w.returncode == 0 for w in self.workers)

    @property
    def first_failure(self) -> WorkerResult | None:
        for worker in self.workers:
            if worker.returncode not in (0, None) and worker.returncode >= 0:
                return worker
        for worker in self.workers:
            if worker.returncode != 0:
                return worker
        return None

    def describe_failure(self) -> str:
        """A message naming the failing worker with the tail of its output."""
        if self.ok:
            return "all workers succeeded"
        if self.timed_out:
            head = f"workers timed out after {self.seconds:.0f} s"
            worker = self.workers[0]
        else:
            worker = self.first_failure
            head = f"worker {worker.index} exited with code {worker.returncode}"
        tails = "\n".join(
            f"--- worker {w.index} (exit {w.returncode}) ---\n{w.output[-6000:]}"
            for w in self.workers
        )
        del worker
        return f"{head}\n{tails}"


def tf_configs(num_workers: int, host: str = "127.0.0.1", ports=None) -> list[dict]:
    """One TF_CONFIG dict per worker, all on `host` with free (or given) ports."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int):
        raise TypeError(
            f"`num_workers` must be an integer. Received: num_workers={num_workers!r}."
        )
    if num_workers < 1:
        raise ValueError(
            f"`num_workers` must be at least 1. Received: num_workers={num_workers}."
        )
    ports = list(ports) if ports is not None else free_ports(num_workers, host)
    if len(ports) != num_workers:
        raise ValueError(
            f"`ports` must list one port per worker ({num_workers}). "
            f"Received: ports={ports}."
        )
    cluster = {"worker": [f"{host}:{port}" for port in ports]}
    return [
        {"cluster": cluster, "task": {"type": "worker", "index": index}}
        for index in range(num_workers)
    ]


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

    Args:
        command: The program and its arguments, e.g. `["python", "train.py"]`.
        num_workers: How many worker processes to start.
        timeout: Seconds before all workers are stopped. Defaults to `None` (none).
        env: Extra environment variables for every worker. Defaults to `None`.
        cwd: Working directory of the workers. Defaults to `None` (this one's).
        host: Address the workers listen on. Defaults to `"127.0.0.1"`.
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
        raise ValueError("`command` must name a program to run. Received: command=[].")
    configs = tf_configs(num_workers, host=host, ports=ports)
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    processes = []
    tails = [collections.deque(maxlen=_TAIL_LINES) for _ in range(num_workers)]
    readers = []
    lock = threading.Lock()
    for index, config in enumerate(configs):
        worker_env = dict(os.environ)
        worker_env.update(env or {})
        worker_env["TF_CONFIG"] = json.dumps(config)
        worker_env["KERAS_REPLICATOR_WORKER_INDEX"] = str(index)
        worker_env["KERAS_REPLICATOR_NUM_WORKERS"] = str(num_workers)
        worker_env.setdefault("PYTHONUNBUFFERED", "1")
        process = subprocess.Popen(
            list(command),
            env=worker_env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        processes.append(process)
        reader = threading.Thread(
            target=_pump, args=(process, index, tails[index], echo, lock), daemon=True
        )
        reader.start()
        readers.append(reader)

    timed_out = False
    try:
        while True:
            codes = [p.poll() for p in processes]
            if all(code is not None for code in codes):
                break
            if any(code not in (None, 0) for code in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.05)
    finally:
        _stop(processes, grace_seconds)
        for reader in readers:
            reader.join(timeout=5)
    return LaunchResult(
        workers=tuple(
            WorkerResult(index, p.returncode, "".join(tails[index]))
            for index, p in enumerate(processes)
        ),
        timed_out=timed_out,
        seconds=time.monotonic() - started,
    )


def _pump(process, index, tail, echo, lock):
    for line in process.stdout:
        tail.append(line)
        if echo:
            with lock:
                sys.stdout.write(f"[worker {index}] {line}")
                sys.stdout.flush()


def _stop(processes, grace_seconds):
    """SIGTERM every live worker's process group, then SIGKILL what remains."""
    live = [p for p in processes if p.poll() is None]
    for process in live:
        _signal_group(process, signal.SIGTERM)
    end = time.monotonic() + grace_seconds
    for process in live:
        try:
            process.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def _signal_group(process, sig):
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
