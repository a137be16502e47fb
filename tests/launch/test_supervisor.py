"""supervise(): one supervisor, the kind of group a small rules object.

`run_group` (tests/launch/test_runner.py) and `run_ps_group`
(tests/launch/test_ps_runner.py) are its two rules; here a rules object of a
test's own shows the seam: the rules end the run, may stop it early with a grace
of their own, and build the result.
"""

import sys

from keras_replicator.launch._results import LaunchResult
from keras_replicator.launch._supervisor import WorkerSpec, supervise

PY = sys.executable
QUICK = (PY, "-c", "print('done')")
SLOW = (PY, "-c", "import time; time.sleep(60)")


class FirstExitEnds:
    """Ends the run when any process exited; or stops it at once if asked."""

    def __init__(self, stop_at_once=False):
        self.stop_grace = 0.5
        self.stop_at_once = stop_at_once
        self.asked = 0

    def ended(self, group, now):
        self.asked += 1
        group.record_exits(now)
        return any(process.returncode is not None for process in group.processes)

    def interrupts(self, group):
        return self.stop_at_once

    def result(self, group, stopped, timed_out, interrupted):
        workers = group.results(stopped, labelled=lambda position: True)
        return LaunchResult(workers, timed_out, seconds=0.0, interrupted=interrupted)


def _run(rules, *commands, timeout=30):
    specs = [
        WorkerSpec(index, None, label=f"task {index}", command=command)
        for index, command in enumerate(commands)
    ]
    return supervise(
        [PY],
        specs,
        rules,
        timeout=timeout,
        env=None,
        cwd=None,
        echo=False,
        grace_seconds=30,
    )


def test_the_rules_end_the_run_and_the_rest_is_stopped():
    rules = FirstExitEnds()
    result = _run(rules, QUICK, SLOW)
    quick, slow = result.workers
    assert quick.returncode == 0 and not quick.stopped
    assert quick.output.strip() == "done" and quick.label == "task 0"
    assert slow.stopped and slow.returncode is not None
    assert not result.timed_out and not result.interrupted and rules.asked >= 1


def test_the_rules_stop_a_run_early_with_their_own_grace():
    result = _run(FirstExitEnds(stop_at_once=True), SLOW, SLOW)
    assert result.interrupted and all(w.stopped for w in result.workers)


def test_the_deadline_ends_a_run_the_rules_would_not():
    result = _run(FirstExitEnds(), SLOW, timeout=0.2)
    assert result.timed_out and result.workers[0].stopped
