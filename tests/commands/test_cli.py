import subprocess
import sys

import pytest


def _cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "keras_replicator.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_the_subcommands():
    out = _cli("--help")
    assert out.returncode == 0
    for name in ("env", "launch", "test"):
        assert name in out.stdout


def test_launch_runs_the_program_on_each_worker():
    out = _cli("launch", "-n", "2", "--", sys.executable, "-c", "print('hi')")
    assert out.returncode == 0, out.stderr
    assert "[worker 0] hi" in out.stdout and "[worker 1] hi" in out.stdout


def test_launch_propagates_a_failure():
    out = _cli("launch", "-n", "2", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert out.returncode == 3
    assert "exited with code 3" in out.stderr


def test_launch_without_a_program_explains_usage():
    out = _cli("launch", "-n", "2")
    assert out.returncode == 2
    assert "after `--`" in out.stderr


@pytest.mark.slow(
    reason="covered in the default run by: tests/commands/test_test_command.py::"
    "test_a_gpu_factory_asked_for_by_name_is_reported_not_passed (the command's "
    "table) and tests/testing/test_conformance.py::"
    "test_local_strategy_passes[multi-device-2-fit_numpy] (the check passing)"
)
def test_conformance_command_prints_a_table():
    out = _cli(
        "test",
        "--factories",
        "multi-device-2",
        "--checks",
        "fit_numpy,predict",
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| check | multi-device-2 |" in out.stdout
    assert "| fit_numpy | pass |" in out.stdout
