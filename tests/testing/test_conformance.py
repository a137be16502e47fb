"""The conformance suite on our strategies: every check must pass.

Local strategies run in this process (on the session's 4 logical CPUs); the
multi-worker strategy runs once in 2 real worker processes on 127.0.0.1 (on its
default transport, the socket ring; on TensorFlow's collectives in the slow run) and
each check's row is asserted separately.
"""

import functools

import pytest

from keras_replicator.testing import CHECK_NAMES, run_conformance
from keras_replicator.testing._factories import get_factory
from keras_replicator.testing._worker import run_checks_here


@functools.cache
def _strategy(name):
    return get_factory(name).build()


class _Built:
    def __init__(self, strategy):
        self.build = lambda: strategy


@pytest.mark.parametrize("check", CHECK_NAMES)
@pytest.mark.parametrize(
    "factory",
    [
        "multi-device-2",
        pytest.param(
            "multi-device-4",
            marks=pytest.mark.slow(
                reason="covered in the default run by: the same checks on "
                "multi-device-2 and multi-worker-2"
            ),
        ),
    ],
)
def test_local_strategy_passes(factory, check):
    [result] = run_checks_here(_Built(_strategy(factory)), [check])
    assert result.passed, result.detail


@functools.cache
def _multi_worker_rows(factory):
    rows = run_conformance([factory], timeout=900)
    return {row.check: row for row in rows}


@pytest.mark.multi_worker
@pytest.mark.timeout(960)
@pytest.mark.parametrize("check", CHECK_NAMES)
def test_multi_worker_strategy_passes(check):
    row = _multi_worker_rows("multi-worker-2")[check]
    assert row.passed, row.detail


@pytest.mark.slow
@pytest.mark.multi_worker
@pytest.mark.timeout(960)
@pytest.mark.parametrize("check", CHECK_NAMES)
def test_multi_worker_on_the_collectives_passes(check):
    """The default is the socket ring; TensorFlow's collectives must pass too."""
    row = _multi_worker_rows("multi-worker-2-collective")[check]
    assert row.passed, row.detail
