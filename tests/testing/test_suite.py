"""GPU factories on a machine without GPUs: "not available" rows, never passes."""

import pytest

from keras_replicator.testing import format_table, run_conformance


@pytest.mark.slow(
    reason="covered in the default run by: tests/commands/test_test_command.py::"
    "test_a_gpu_factory_asked_for_by_name_is_reported_not_passed (the same rows "
    "and table, through the command) and tests/testing/test_worker.py::"
    "test_gpu_factories_are_not_available_without_gpus"
)
def test_gpu_factories_report_no_gpu_in_their_rows_and_the_table():
    rows = run_conformance(["multi-gpu", "multi-worker-gpu-2"], ["fit_numpy"])
    assert [(r.factory, r.passed, r.available) for r in rows] == [
        ("multi-gpu", False, False),
        ("multi-worker-gpu-2", False, False),
    ]
    assert all("needs 2 GPUs, this machine has 0" in r.detail for r in rows)
    table = format_table(rows)
    assert "| fit_numpy | n/a: needs 2 GPUs, this machine has 0 |" in table
    assert "pass" not in table and "FAIL" not in table
