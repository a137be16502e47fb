"""`run_bounded`: a helper command's output is capped, and nothing it starts
outlives its answer or its caller (issue 49, items 5 and 9)."""

import os
import subprocess
import threading
import time

import pytest

from keras_replicator.launch._bounded_run import (
    OutputTooLarge,
    ProcessGroups,
    run_bounded,
)
from tests.launch._processes import gone as _gone


def test_output_past_the_cap_kills_the_command_and_reads_no_more():
    started = time.monotonic()
    with pytest.raises(OutputTooLarge, match="more than 65536 bytes"):
        run_bounded("yes x", 20.0, shell=True, max_bytes=1 << 16)
    assert time.monotonic() - started < 10
    code, out, _ = run_bounded("head -c 65536 /dev/zero", 5.0, shell=True)
    assert code == 0 and len(out) == 65536  # within the cap: all of it


def test_what_a_finished_command_left_running_is_killed(tmp_path):
    """Before: a child the command started in the background ran on."""
    code, out, _ = run_bounded("sleep 60 >/dev/null 2>&1 & echo $!", 10.0, shell=True)
    assert code == 0
    assert _gone(int(out))


def test_closing_the_groups_kills_and_reaps_a_running_command(tmp_path):
    pids = tmp_path / "pids"
    groups = ProcessGroups()
    outcome = []

    def ask():
        try:
            run_bounded(
                f"sleep 60 & echo $$ $! > {pids}; wait", 60.0, shell=True, groups=groups
            )
        except subprocess.SubprocessError as error:
            outcome.append(error)

    thread = threading.Thread(target=ask)
    thread.start()
    while not pids.exists() or not pids.read_text().strip():
        time.sleep(0.02)
    shell, child = map(int, pids.read_text().split())
    groups.close()
    assert _gone(shell, child)
    thread.join(10)
    assert not thread.is_alive()
    with pytest.raises(ChildProcessError):
        os.waitpid(shell, os.WNOHANG)  # reaped, not a zombie
    run_bounded("true", 5.0, groups=groups)  # after close: killed at once, no hang
