"""What a run of a worker group did, and how to say what went wrong.

`first_failure` is the worker that failed first *in time* and on its own (not
stopped by the launcher): the one to blame, since the others usually fail because
it did. `headline()` turns the exit timeline into one sentence: who failed first,
who had already left with exit code 0, who was still running when a collective
timed out (a hung peer), and whom the launcher stopped.
"""

from __future__ import annotations

import dataclasses
import signal

_TRACEBACK_START = "Traceback (most recent call last):"
# What TensorFlow reports when a collective outlives its timeout.
# What a collective that waited out its timeout reports: TensorFlow's, and the
# socket ring's (`ring/_socket_ring.SocketRing._fail`, through the UnknownError
# TensorFlow makes of any error raised in a `tf.numpy_function`).
_COLLECTIVE_TIMEOUT_MARKERS = (
    "DeadlineExceeded",
    "Collective has timed out",
    "did not finish within the collective timeout",
)
# What TensorFlow reports when its gRPC server cannot bind the TF_CONFIG port.
_LOST_PORT_MARKERS = ("Could not start gRPC server",)


@dataclasses.dataclass(frozen=True)
class WorkerResult:
    """What one worker did.

    Attributes:
        index: The worker's index in the cluster (its `TF_CONFIG` task index).
        returncode: Exit code; negative when ended by a signal, `None` if unknown.
        output: The last lines the worker printed (stdout and stderr).
        seconds: When it exited, in seconds after the group started.
        stopped: Whether the launcher stopped it (after another worker failed or
            at the deadline) rather than it exiting on its own.
        label: Its task name (`"chief"`, `"ps 0"`) in a parameter-server job;
            `None` for a worker of a group of peers.
        address: `(TF_CONFIG field, "host:port")` of its gRPC server, when it
            has a `TF_CONFIG`; named when the port was lost.
        preempted: Whether it stopped after a preemption backup
            (`BackupAndRestore` told the launcher so) rather than at the end of
            training.
    """

    index: int
    returncode: int | None
    output: str
    seconds: float | None = None
    stopped: bool = False
    label: str | None = None
    address: tuple[str, str] | None = None
    preempted: bool = False

    @property
    def lost_port(self) -> bool:
        """Whether TensorFlow failed to bind this worker's port (taken meanwhile)."""
        return any(marker in self.output for marker in _LOST_PORT_MARKERS)

    @property
    def name(self) -> str:
        """How messages call it: its label, else `worker <index>`."""
        return self.label or f"worker {self.index}"

    @property
    def traceback(self) -> str:
        """The last Python traceback in the output, or `""` if there is none."""
        start = self.output.rfind(_TRACEBACK_START)
        return "" if start < 0 else self.output[start:].rstrip()


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    """The outcome of one run of a worker group.

    Attributes:
        workers: One `WorkerResult` per worker, in index order.
        timed_out: Whether the deadline stopped the group.
        seconds: Wall-clock seconds of this run.
        restarts: How many times the group was restarted before this run.
        previous: The failed runs before this one (empty without restarts).
        job_index: In a parameter-server job, the position of the chief, whose
            exit code is the job's; `None` for a group of peers.
        rejoins: Workers restarted to rejoin a parameter-server job.
        services: The tf.data service dispatcher and workers started beside the
            workers (`data_service_workers`), labelled `"data dispatcher"` and
            `"data worker i"`; the launcher stops them at the end, so one that
            was not stopped exited on its own and failed the run.
        interrupted: Whether the launcher stopped the group on purpose to resize
            it (an elastic launch's discovery saw slots come or go).
        resizes: How many times an elastic launch started the group again with
            another number of workers because slots came or went (not counted in
            `restarts`, which counts failures and preemptions).
    """

    workers: tuple[WorkerResult, ...]
    timed_out: bool
    seconds: float
    restarts: int = 0
    previous: tuple[LaunchResult, ...] = ()
    job_index: int | None = None
    rejoins: int = 0
    services: tuple[WorkerResult, ...] = ()
    interrupted: bool = False
    resizes: int = 0

    @property
    def ok(self) -> bool:
        if any(not s.stopped for s in self.services):
            return False
        if self.job_index is not None:
            return not self.timed_out and self.workers[self.job_index].returncode == 0
        return not self.timed_out and all(w.returncode == 0 for w in self.workers)

    @property
    def preempted(self) -> bool:
        """Whether the run ended with a preemption backup, not finished training.

        Every worker exited with 0 and at least one said it was preempted: the
        job is not done, and starting it again resumes at the backup's step.
        """
        return self.ok and any(w.preempted for w in self.workers)

    @property
    def total_seconds(self) -> float:
        """Seconds of this run and every earlier (failed) run."""
        return self.seconds + sum(run.seconds for run in self.previous)

    @property
    def first_failure(self) -> WorkerResult | None:
        """The worker that failed first on its own; else any worker that failed.

        In a parameter-server job, the chief when it failed (its error says why).
        """
        if self.job_index is not None:
            chief = self.workers[self.job_index]
            if chief.returncode not in (0, None):
                return chief
        own = [w for w in self.workers if w.returncode not in (0, None)]
        own = [w for w in own if not w.stopped]
        own += [s for s in self.services if not s.stopped]  # left on its own
        if own:
            return min(own, key=lambda w: (w.seconds is None, w.seconds or 0.0))
        for worker in self.workers:
            if worker.returncode not in (0, None) and worker.returncode >= 0:
                return worker
        for worker in self.workers:
            if worker.returncode != 0:
                return worker
        return None

    def headline(self) -> str:
        """One sentence: what went wrong and who started it."""
        if self.preempted:
            return (
                f"all {len(self.workers)} workers were preempted and backed up at "
                "the same step (exit code 0): start the job again to resume there"
            )
        if self.ok:
            return f"all {len(self.workers)} workers succeeded"
        if self.timed_out and not self.workers:
            return (
                "the timeout came before another group of workers started "
                "(waiting for slots from discover, or while the last group stopped)"
            )
        if self.timed_out:
            return (
                f"workers timed out after {self.seconds:.0f} s and were stopped"
                + _still_running_note(self.workers)
            )
        failure = self.first_failure
        assert failure is not None  # neither all ok nor timed out: one failed
        when = "" if failure.seconds is None else f" after {failure.seconds:.1f} s"
        head = (
            f"{failure.name} exited with code "
            f"{_describe_code(failure.returncode)}{when}, the first to fail"
        )
        early = [
            w
            for w in self.workers
            if w.returncode == 0
            and w.seconds is not None
            and failure.seconds is not None
            and w.seconds < failure.seconds
        ]
        if early:
            names = ", ".join(f"{w.index} (at {w.seconds:.1f} s)" for w in early)
            head += f"; before that, worker(s) {names} had exited with code 0"
        stopped = [
            w.index if w.label is None else w.label for w in self.workers if w.stopped
        ]
        if stopped and any(m in failure.output for m in _COLLECTIVE_TIMEOUT_MARKERS):
            head += (
                f"; it timed out waiting for its peers in a collective while "
                f"worker(s) {stopped} were still running: they stopped answering "
                "(hung, or stuck outside training)"
            )
        if stopped:
            head += f"; the launcher stopped worker(s) {stopped}"
        if self.lost_port is not None:
            head += _lost_port_note(self.lost_port)
        return head

    @property
    def lost_port(self) -> WorkerResult | None:
        """The first worker whose gRPC server could not bind its port, if any."""
        return next((w for w in self.services + self.workers if w.lost_port), None)

    def describe_failure(self) -> str:
        """The headline, then each worker's output tail (the failing one first)."""
        if self.ok:
            return "all workers succeeded"
        failure = self.first_failure
        order = sorted(self.workers + self.services, key=lambda w: w is not failure)
        tails = "\n".join(
            f"--- {w.name} (exit {_describe_code(w.returncode)}"
            f"{', stopped by the launcher' if w.stopped else ''}) ---\n"
            f"{w.output[-6000:]}"
            for w in order
        )
        return f"{self.headline()}\n{tails}"


def _describe_code(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            return str(code)
    return str(code)


def _lost_port_note(failure: WorkerResult) -> str:
    if failure.address is None:
        where = "its TF_CONFIG port"
    else:
        field, address = failure.address
        port = address.rpartition(":")[2]
        where = f"port {port} (`{field}` = {address!r})"
    return (
        f"; TensorFlow could not start {failure.name}'s gRPC server on {where}: "
        "another process took the port after the launcher chose it, or it is "
        "in use. Run again (local workers get fresh ports each run, and "
        "`--max-restarts` retries on fresh ports), or free the port"
    )


def _still_running_note(workers) -> str:
    exited = [w.index for w in workers if not w.stopped]
    return f" (worker(s) {exited} had already exited)" if exited else ""
