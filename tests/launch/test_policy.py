"""RestartPolicy: one decision per kind of stopped group, without processes."""

import signal
import time

import pytest

from keras_replicator.launch._policy import (
    PORT_RETRIES,
    Action,
    Counters,
    Decision,
    Reason,
    RestartPolicy,
)
from keras_replicator.launch._results import LaunchResult, WorkerResult

LOST_PORT_OUTPUT = "E tensorflow: Could not start gRPC server"


def _group(*workers, timed_out=False, interrupted=False):
    return LaunchResult(
        workers=tuple(workers),
        timed_out=timed_out,
        seconds=1.0,
        interrupted=interrupted,
    )


def _worker(index=0, returncode=0, output="", stopped=False, preempted=False):
    return WorkerResult(index, returncode, output, stopped=stopped, preempted=preempted)


FINISHED = _group(_worker(0), _worker(1))
FAILED = _group(_worker(0), _worker(1, returncode=1))
PREEMPTED = _group(_worker(0, preempted=True), _worker(1, preempted=True))
LOST_PORT = _group(_worker(0, returncode=1, output=LOST_PORT_OUTPUT), _worker(1))
RESIZED = _group(
    _worker(0, stopped=True), _worker(1, stopped=True, preempted=True), interrupted=True
)
CUT_SHORT = _group(
    _worker(0, stopped=True, preempted=True),
    _worker(1, returncode=-signal.SIGKILL, stopped=True),
    interrupted=True,
)


def _decide(result, max_restarts=1, **counters):
    return RestartPolicy(max_restarts).decide(result, Counters(**counters))


def test_a_finished_group_is_done():
    assert _decide(FINISHED) == Decision(Action.DONE, Reason.FINISHED)


def test_a_group_stopped_by_the_deadline_is_done_with_restarts_left():
    result = _group(_worker(0, returncode=None, stopped=True), timed_out=True)
    assert _decide(result, max_restarts=5) == Decision(Action.DONE, Reason.TIMED_OUT)


def test_a_failed_group_restarts_while_restarts_are_left():
    decision = _decide(FAILED, max_restarts=2, restarts=1)
    assert decision == Decision(Action.RESTART, Reason.FAILED)
    assert decision.counted and not decision.resized


def test_a_failed_group_is_done_without_restarts_left():
    decision = _decide(FAILED, max_restarts=2, restarts=2)
    assert decision == Decision(Action.DONE, Reason.FAILED)
    assert decision.out_of_restarts


def test_a_preempted_group_restarts_like_a_failed_one():
    assert _decide(PREEMPTED) == Decision(Action.RESTART, Reason.PREEMPTED)
    assert _decide(PREEMPTED, max_restarts=0) == Decision(Action.DONE, Reason.PREEMPTED)


def test_a_lost_port_restarts_without_counting():
    decision = _decide(LOST_PORT, max_restarts=0)
    assert decision == Decision(Action.RESTART, Reason.LOST_PORT)
    assert not decision.counted


def test_lost_ports_are_retried_only_port_retries_times():
    spent = _decide(LOST_PORT, max_restarts=0, port_retries=PORT_RETRIES)
    assert spent == Decision(Action.DONE, Reason.FAILED)


def test_given_ports_are_not_retried():
    policy = RestartPolicy(max_restarts=1, port_retries=0)
    assert policy.decide(LOST_PORT, Counters()) == Decision(
        Action.RESTART, Reason.FAILED
    )


def test_a_group_stopped_for_new_slots_resizes_even_without_restarts_left():
    decision = _decide(RESIZED, max_restarts=0)
    assert decision == Decision(Action.RESIZE, Reason.SLOTS_CHANGED)
    assert decision.resized and not decision.counted


def test_a_resize_cut_short_by_its_grace_counts_as_a_restart():
    decision = _decide(CUT_SHORT)
    assert decision == Decision(Action.RESTART, Reason.CUT_SHORT)
    assert decision.counted and decision.resized
    assert _decide(CUT_SHORT, max_restarts=0) == Decision(Action.DONE, Reason.CUT_SHORT)


def test_a_worker_failing_on_its_own_during_a_resize_is_a_failure():
    result = _group(
        _worker(0, returncode=1), _worker(1, stopped=True), interrupted=True
    )
    assert _decide(result) == Decision(Action.RESTART, Reason.FAILED)


def test_a_group_that_finished_while_being_resized_is_done():
    result = _group(_worker(0, stopped=True), interrupted=True)
    assert _decide(result) == Decision(Action.DONE, Reason.FINISHED)


@pytest.mark.parametrize(
    "decision, expected",
    [
        (Decision(Action.RESTART, Reason.FAILED), Counters(restarts=1)),
        (Decision(Action.RESTART, Reason.CUT_SHORT), Counters(restarts=1)),
        (Decision(Action.RESTART, Reason.LOST_PORT), Counters(port_retries=1)),
        (Decision(Action.RESIZE, Reason.SLOTS_CHANGED), Counters(resizes=1)),
        (Decision(Action.DONE, Reason.FINISHED), Counters()),
    ],
)
def test_counters_count_what_each_decision_uses(decision, expected):
    assert Counters().after(decision) == expected


def test_the_deadline():
    assert RestartPolicy(0).seconds_left() is None
    assert not RestartPolicy(0).deadline_passed()
    passed = RestartPolicy(0, deadline=time.monotonic() - 1)
    assert passed.deadline_passed() and passed.seconds_left() == 0.0
    ahead = RestartPolicy(0, deadline=time.monotonic() + 60)
    assert not ahead.deadline_passed() and 0 < ahead.seconds_left() <= 60
