"""The DTensor tests, in a pytest process of their own (tests/conftest.py says why).

One child process runs tests/layouts/, tests/strategies/test_model_parallel.py
and the DTensor modules' docstring examples, with this run's marker selection
(`make test`: the default tests; `make test-slow`: the slow ones). A failure
here shows the child's report.
"""

import os
import subprocess
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_child(markexpr: str):
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        markexpr,
        "tests/layouts",
        "tests/strategies/test_model_parallel.py",
        "tests/test_docstring_examples.py",
    ]
    env = {**os.environ, "KR_DTENSOR_TEST_PROCESS": "1"}
    result = subprocess.run(
        command, cwd=_REPO, env=env, capture_output=True, text=True, timeout=1500
    )
    summary = (result.stdout + result.stderr)[-8000:]
    # rc 5: nothing selected (e.g. no slow DTensor test).
    assert result.returncode in (0, 5), summary
    return summary


@pytest.mark.timeout(1600)
def test_the_dtensor_tests_pass_in_their_own_process(request):
    _run_child(request.config.getoption("markexpr") or "not slow and not notebook")


@pytest.mark.slow(
    reason="the slow DTensor tests; the default ones run in the test above"
)
@pytest.mark.timeout(1600)
def test_the_slow_dtensor_tests_pass_in_their_own_process():
    _run_child("slow")
