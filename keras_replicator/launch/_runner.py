"""Runs a group of peer workers until the group is done (`run_group`).

The process runner of the project: `keras-replicator launch`, `launch()`,
`launch_function()`, the conformance suite's multi-worker cases and the tests all
start workers here. Starting, echoing, polling and stopping are the one
supervisor's (`_supervisor.py`, shared with parameter-server jobs); this module
holds the rules of a group of peers:

- The first worker to exit non-zero (or the deadline) stops the others: SIGTERM to
  each worker's process group, SIGKILL after `grace_seconds`. A worker that exits 0
  is left alone, so a slow chief can still write its final checkpoint.
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
  launcher stopped it, whether it stopped after a preemption backup, and the tail
  of its output. `first_failure` is the worker that failed first *in time* and on
  its own, which is the one to blame: the others usually fail because it did.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence

from keras_replicator._environment import NUM_WORKERS, PREEMPTED_FILE, WORKER_INDEX
from keras_replicator._tf_config import format_address, validate_tf_config
from keras_replicator.launch._ports import free_ports
from keras_replicator.launch._results import LaunchResult
from keras_replicator.launch._supervisor import RunningGroup, WorkerSpec, supervise

__all__ = ["WorkerSpec", "run_group", "run_workers", "tf_configs"]


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
                WORKER_INDEX: str(index),
                NUM_WORKERS: str(num_workers),
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
    rules = _Peers(len(services), stop_when, stop_when_grace)
    return supervise(
        command,
        list(services) + list(specs),
        rules,
        timeout=timeout,
        env=env,
        cwd=cwd,
        echo=echo,
        grace_seconds=grace_seconds,
    )


@dataclasses.dataclass
class _Peers:
    """`run_group`'s rules: services first, the first failure ends the group.

    Positions before `first` are the service tasks.
    """

    first: int
    stop_when: Callable[[], bool] | None
    stop_grace: float | None

    def ended(self, group: RunningGroup, now: float) -> bool:
        group.record_exits(now)
        codes = [p.returncode for p in group.processes[self.first :]]
        if all(code is not None for code in codes):
            return True
        if any(code not in (None, 0) for code in codes):
            return True
        # A service task that left before the workers were done fails the group.
        return any(p.returncode is not None for p in group.processes[: self.first])

    def interrupts(self, group: RunningGroup) -> bool:
        # Once a worker is done (exit 0), the group is ending: no resize.
        codes = [p.returncode for p in group.processes[self.first :]]
        if self.stop_when is None or any(code is not None for code in codes):
            return False
        return self.stop_when()

    def result(
        self, group: RunningGroup, stopped: set[int], timed_out: bool, interrupted: bool
    ) -> LaunchResult:
        results = group.results(
            stopped, lambda position: position < self.first, _preempted
        )
        return LaunchResult(
            workers=results[self.first :],
            timed_out=timed_out,
            interrupted=interrupted,
            seconds=time.monotonic() - group.started,
            services=results[: self.first],
        )


def _preempted(spec: WorkerSpec) -> bool:
    """Whether the worker said it stopped after a preemption backup."""
    path = spec.env.get(PREEMPTED_FILE)
    return path is not None and os.path.exists(path)
