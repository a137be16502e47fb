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
- Starting, output, signals, the reaper and the stop routine are the one
  supervisor's (`_supervisor.py`, as for `run_group`): serving tasks never
  outlive the launcher. These rules are `_ParameterServerJob`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from keras_replicator.launch._output import note
from keras_replicator.launch._results import LaunchResult
from keras_replicator.launch._supervisor import RunningGroup, WorkerSpec, supervise

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
    rules = _ParameterServerJob(specs, max_rejoins, ps_failure_grace, echo)
    return supervise(
        command,
        specs,
        rules,
        timeout=timeout,
        env=env,
        cwd=cwd,
        echo=echo,
        grace_seconds=grace_seconds,
    )


class _ParameterServerJob:
    """`run_ps_group`'s rules: the chief's exit ends the job, workers rejoin."""

    stop_grace: float | None = None  # never stopped early: no resize

    def __init__(self, specs, max_rejoins: int, ps_failure_grace: float, echo):
        self.kinds = [(spec.label or "").split(" ")[0] for spec in specs]
        self.chief = self.kinds.index("chief")
        self.rejoins = [0] * len(specs)
        self.max_rejoins = max_rejoins
        self.ps_failure_grace = ps_failure_grace
        self.echo = echo
        self.ps_died_at: float | None = None

    def ended(self, group: RunningGroup, now: float) -> bool:
        processes = group.processes
        if processes[self.chief].poll() is not None:
            group.exits[self.chief] = now - group.started
            return True
        for position, process in enumerate(processes):
            if position == self.chief or process.poll() is None:
                continue
            kind, label = self.kinds[position], group.specs[position].label
            if kind == "worker" and self.rejoins[position] < self.max_rejoins:
                self.rejoins[position] += 1
                self._note(
                    f"{label} exited with code {process.returncode}; restarting it "
                    f"to rejoin the job ({self.rejoins[position]} of "
                    f"{self.max_rejoins})."
                )
                time.sleep(_REJOIN_DELAY_SECONDS)
                group.start(position)
                continue
            if group.exits[position] is None:
                group.exits[position] = now - group.started
                if kind == "ps":
                    self.ps_died_at = now
                    self._note(
                        f"{label} exited with code {process.returncode}; the chief "
                        "will fail (its variables are gone)."
                    )
        died = self.ps_died_at
        return died is not None and now - died > self.ps_failure_grace

    def interrupts(self, group: RunningGroup) -> bool:
        return False

    def result(
        self, group: RunningGroup, stopped: set[int], timed_out: bool, interrupted: bool
    ) -> LaunchResult:
        return LaunchResult(
            workers=group.results(stopped, labelled=lambda position: True),
            timed_out=timed_out,
            seconds=time.monotonic() - group.started,
            job_index=self.chief,
            rejoins=sum(self.rejoins),
        )

    def _note(self, message: str) -> None:
        if self.echo:
            note(message)
