"""The launcher's restart policy: after a group stops, what happens next.

`launch()` runs a worker group, reads its `LaunchResult` and then either stops
(the job is done, or may not go on), starts the group again (a restart), or
starts it on another number of workers (an elastic resize). That choice has a
few rules that interact — a lost port is retried without counting, a resize
whose workers did not all exit in `resize_grace_seconds` counts as a restart,
a preemption is restarted like a failure — so it lives here, as one object
with one method, `RestartPolicy.decide`, testable without processes
(`tests/launch/test_policy.py`). `_launcher._supervise` only carries out the
decision: it waits for slots, prints the note and starts the next group.

Counted decisions use up `max_restarts`; resizes and port retries do not. A
resize cut short by its grace period counts: otherwise a discovery hook whose
answer flaps could cut every backup and loop without end (`_group_outcome.py`).
"""

from __future__ import annotations

import dataclasses
import enum
import time

from keras_replicator.launch._group_outcome import failed_on_its_own, killed_at_the_end
from keras_replicator.launch._results import LaunchResult

# Runs started again on fresh ports when TF could not bind a port the launcher
# chose (another process took it in between); not counted as restarts.
PORT_RETRIES = 2


class Action(enum.Enum):
    """What the launcher does after a group stopped."""

    DONE = "done"  # return this result
    RESTART = "restart"  # start the group again, same size unless slots changed
    RESIZE = "resize"  # start the group again on the slots discovery lists now


class Reason(enum.Enum):
    """Why: what the stopped group's result showed."""

    FINISHED = "every worker finished"
    TIMED_OUT = "the deadline stopped the group"
    FAILED = "a worker failed"
    PREEMPTED = "the workers stopped after a preemption backup"
    LOST_PORT = "TensorFlow could not bind a port the launcher chose"
    SLOTS_CHANGED = "the slots changed"
    CUT_SHORT = "a resize ran past resize_grace_seconds"


@dataclasses.dataclass(frozen=True)
class Decision:
    """One decision of `RestartPolicy.decide`.

    Attributes:
        action: Done, restart or resize.
        reason: What in the result led to it.
    """

    action: Action
    reason: Reason

    @property
    def counted(self) -> bool:
        """Whether carrying it out uses one of `max_restarts`."""
        return self.action is Action.RESTART and self.reason is not Reason.LOST_PORT

    @property
    def resized(self) -> bool:
        """Whether the launcher had stopped the group on purpose to resize it."""
        return self.reason in (Reason.SLOTS_CHANGED, Reason.CUT_SHORT)

    @property
    def out_of_restarts(self) -> bool:
        """Whether the group would have restarted, had a restart been left."""
        return self.action is Action.DONE and self.reason in (
            Reason.FAILED,
            Reason.PREEMPTED,
            Reason.CUT_SHORT,
        )


@dataclasses.dataclass(frozen=True)
class Counters:
    """What the launch has used so far.

    Attributes:
        restarts: Counted restarts (failures, preemptions, resizes cut short).
        port_retries: Runs started again on fresh ports after a lost port.
        resizes: Runs started again because the slots changed.
    """

    restarts: int = 0
    port_retries: int = 0
    resizes: int = 0

    def after(self, decision: Decision) -> Counters:
        """The counters once `decision` is carried out."""
        if decision.reason is Reason.LOST_PORT:
            return dataclasses.replace(self, port_retries=self.port_retries + 1)
        if decision.action is Action.RESIZE:
            return dataclasses.replace(self, resizes=self.resizes + 1)
        if decision.counted:
            return dataclasses.replace(self, restarts=self.restarts + 1)
        return self


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """Decides, from a stopped group's result, whether and how to go on.

    Attributes:
        max_restarts: Counted restarts allowed (`--max-restarts`).
        port_retries: Restarts on fresh ports allowed after a lost port; `0`
            where the ports are not the launcher's to change (given ports, a
            scheduler's cluster). Defaults to `PORT_RETRIES`.
        deadline: `time.monotonic()` at which everything stops, or `None`.

    Example:
    >>> from keras_replicator.launch._results import LaunchResult, WorkerResult
    >>> policy = RestartPolicy(max_restarts=1)
    >>> failed = LaunchResult((WorkerResult(0, 1, ""),), timed_out=False, seconds=1)
    >>> policy.decide(failed, Counters()).action
    <Action.RESTART: 'restart'>
    >>> policy.decide(failed, Counters(restarts=1)).action
    <Action.DONE: 'done'>
    """

    max_restarts: int
    port_retries: int = PORT_RETRIES
    deadline: float | None = None

    def decide(self, result: LaunchResult, counters: Counters) -> Decision:
        """What to do after the group that produced `result` stopped."""
        if self._lost_a_port(result) and counters.port_retries < self.port_retries:
            return Decision(Action.RESTART, Reason.LOST_PORT)
        if result.timed_out:
            return Decision(Action.DONE, Reason.TIMED_OUT)
        if result.ok and not result.preempted:
            return Decision(Action.DONE, Reason.FINISHED)
        resized = result.interrupted and not failed_on_its_own(result)
        if resized and not killed_at_the_end(result):
            return Decision(Action.RESIZE, Reason.SLOTS_CHANGED)
        if resized:
            reason = Reason.CUT_SHORT  # maybe mid-backup
        else:
            reason = Reason.PREEMPTED if result.preempted else Reason.FAILED
        if counters.restarts >= self.max_restarts:
            return Decision(Action.DONE, reason)
        return Decision(Action.RESTART, reason)

    def seconds_left(self) -> float | None:
        """Seconds until the deadline (at least 0), or `None` without one."""
        if self.deadline is None:
            return None
        return max(self.deadline - time.monotonic(), 0.0)

    def deadline_passed(self) -> bool:
        """Whether the deadline has come: no further group may start."""
        return self.deadline is not None and self.deadline <= time.monotonic()

    @staticmethod
    def _lost_a_port(result: LaunchResult) -> bool:
        """Whether the run failed only because TF could not bind its port."""
        return (
            not result.ok
            and not result.timed_out
            and not result.interrupted
            and result.lost_port is not None
        )
