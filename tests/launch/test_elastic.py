"""Elastic launches with plain Python workers (no TensorFlow): fast and exact.

The TensorFlow side (the numbers after a shrink and a growth) is
tests/callbacks/test_elastic_multi_worker.py; here the launcher's rules: which
size each run gets, what counts as a restart, what a preempted run is.
"""

import contextlib
import os
import signal
import sys
import textwrap
import threading
import time

import pytest

from keras_replicator.launch import LaunchOptions, launch
from keras_replicator.launch._elastic import Discovery, workers_for
from keras_replicator.launch._signals import StopSignal, stop_on_signals
from tests.launch._processes import gone as _gone

PY = sys.executable

# Every worker prints what it was given; the `action` argument says what worker
# `who` does on run `run`: "lose" (shrink the slots file to `slots` lines, exit
# 9), "grow" (grow the slots file, then wait for SIGTERM like BackupAndRestore:
# mark preempted, exit 0), "preempt" (mark preempted, exit 0).
WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    slots_file, action, who, run, lines = sys.argv[1:6]
    env = os.environ
    me = env["KERAS_REPLICATOR_WORKER_INDEX"]
    this_run = env["KERAS_REPLICATOR_RESTART_COUNT"]
    print("size", env["KERAS_REPLICATOR_NUM_WORKERS"], "slot",
          env.get("KERAS_REPLICATOR_SLOT"), flush=True)

    def preempted(*_):
        with open(env["KERAS_REPLICATOR_PREEMPTED_FILE"], "w") as f:
            f.write("here")
        sys.exit(0)

    signal.signal(signal.SIGTERM, preempted)
    mine = me == who
    if mine and action == "lose":
        open(env["RUN_MARK_FILE"], "w").close()
        with open(slots_file, "w") as f:
            f.write(lines.replace(",", "\\n"))
        sys.exit(9)
    if mine and action == "grow" and not os.path.exists(env["RUN_MARK_FILE"]):
        open(env["RUN_MARK_FILE"], "w").close()
        with open(slots_file, "w") as f:
            f.write(lines.replace(",", "\\n"))
    if action == "grow" and env["KERAS_REPLICATOR_NUM_WORKERS"] == "2":
        time.sleep(60)  # until the launcher resizes
    if mine and action == "preempt" and this_run == "0":
        preempted()
    """
)


@contextlib.contextmanager
def _slots_later(path, seconds, *names):
    """Rewrites the slots file `path` to `names` after `seconds`, in the block."""
    timer = threading.Timer(seconds, lambda: open(path, "w").write("\n".join(names)))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _slots(tmp_path, *names):
    path = tmp_path / "slots"
    path.write_text("\n".join(names) + "\n")
    return str(path)


def _run(tmp_path, slots_file, action, who, lines, **options):
    env = {"RUN_MARK_FILE": str(tmp_path / "mark")}
    command = [PY, "-c", WORKER, slots_file, action, who, "0", lines]
    options.setdefault("timeout", 60)
    return launch(command, echo=False, env=env, **options)


def _sizes(output):
    return output.split()[1], output.split()[3]


def test_a_lost_slot_shrinks_the_group_and_counts_as_a_restart(tmp_path):
    slots = _slots(tmp_path, "a", "b", "c")
    result = _run(
        tmp_path,
        slots,
        "lose",
        "2",
        "a,b",
        num_workers=3,
        min_workers=2,
        discover=f"cat {slots}",
        discover_seconds=0.2,
        max_restarts=1,
    )
    assert result.ok and not result.preempted, result.describe_failure()
    assert (result.restarts, result.resizes) == (1, 0)
    assert [_sizes(w.output) for w in result.workers] == [("2", "a"), ("2", "b")]
    (lost,) = result.previous
    assert len(lost.workers) == 3 and lost.first_failure.index == 2


def test_a_slot_that_comes_back_grows_the_group_without_a_restart(tmp_path):
    slots = _slots(tmp_path, "a", "b")
    started = time.monotonic()
    result = _run(
        tmp_path,
        slots,
        "grow",
        "0",
        "a,b,c",
        num_workers=3,
        min_workers=2,
        discover=f"cat {slots}",
        discover_seconds=0.2,
    )
    assert result.ok and not result.preempted, result.describe_failure()
    assert (result.restarts, result.resizes) == (0, 1)
    assert [_sizes(w.output)[1] for w in result.workers] == ["a", "b", "c"]
    (small,) = result.previous
    assert small.interrupted and small.preempted  # stopped by SIGTERM, backed up
    assert [w.returncode for w in small.workers] == [0, 0]
    assert time.monotonic() - started < 30  # not the workers' 60 s sleep


def test_slots_announced_gone_stop_the_group_before_it_fails(tmp_path):
    # The slots file shrinks while every worker is healthy (a preemption notice
    # through discovery): the group is stopped with a backup and goes on smaller.
    slots = _slots(tmp_path, "a", "b", "c")
    sleep = "import os, time; n = os.environ['KERAS_REPLICATOR_NUM_WORKERS']\n"
    command = [PY, "-c", sleep + "time.sleep(60 if n == '3' else 0)"]
    with _slots_later(slots, 1.0, "a", "b"):
        result = launch(
            command,
            3,
            min_workers=2,
            discover=f"cat {slots}",
            discover_seconds=0.2,
            timeout=60,
            grace_seconds=2,
            echo=False,
        )
    assert result.ok and (result.restarts, result.resizes) == (0, 1)
    assert len(result.workers) == 2 and result.previous[0].interrupted


def test_a_preempted_group_is_started_again_and_counted(tmp_path):
    slots = _slots(tmp_path, "unused")
    restarted = _run(tmp_path, slots, "preempt", "1", "", num_workers=2, max_restarts=1)
    assert restarted.ok and not restarted.preempted and restarted.restarts == 1
    assert restarted.previous[0].preempted

    stopped = _run(tmp_path, slots, "preempt", "1", "", num_workers=2)
    assert stopped.ok and stopped.preempted and stopped.restarts == 0
    assert "preempted" in stopped.headline()
    assert [w.preempted for w in stopped.workers] == [False, True]


def test_the_launch_waits_for_min_workers_slots(tmp_path):
    slots = _slots(tmp_path, "a")
    with _slots_later(slots, 1.0, "a", "b", "c", "d"):
        result = launch(
            [PY, "-c", "import os; print(os.environ['KERAS_REPLICATOR_SLOT'])"],
            3,
            min_workers=2,
            discover=f"cat {slots}",
            discover_seconds=0.2,
            timeout=60,
            echo=False,
        )
    assert result.ok
    assert [w.output.strip() for w in result.workers] == ["a", "b", "c"]  # at most 3


def test_no_slots_until_the_timeout_starts_nothing(tmp_path):
    result = launch(
        [PY, "-c", "pass"],
        2,
        discover=lambda: [],
        discover_seconds=0.2,
        timeout=1.0,
        echo=False,
    )
    assert result.timed_out and result.workers == () and not result.ok


def test_discovery_answers_and_failures(capsys):
    assert Discovery(lambda: ["x", " ", "y "], 1.0).ask() == ("x", "y")
    failing = Discovery("echo nope >&2; exit 3", 1.0)
    assert failing.ask() is None and failing.latest is None
    assert failing.ask() is None
    err = capsys.readouterr().err
    assert err.count("discover failed (RuntimeError: exit code 3 nope)") == 1
    assert workers_for(("a", "b", "c", "d"), most=3) == 3


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(num_workers=3, min_workers=2), "`min_workers` needs `discover`"),
        (dict(num_workers=2, min_workers=3, discover="cat s"), "at most"),
        (dict(num_workers=2, num_ps=1, discover="cat s"), "parameter-server job"),
        (dict(num_workers=2, discover="cat s", ports=[5000, 5001]), "fresh ports"),
        (dict(num_workers=2, discover="  "), "Received: discover='  '"),
        (dict(cluster="tf-config", discover="cat s"), "need `num_workers`"),
        (dict(num_workers=2, discover="cat s", discover_seconds=0), "positive"),
        (dict(num_workers=2, discover="cat s", resize_grace_seconds=0), "resize_grace"),
    ],
)
def test_elastic_options_are_checked_up_front(options, message):
    with pytest.raises((TypeError, ValueError), match=message):
        LaunchOptions(**options)


def test_the_cli_runs_an_elastic_launch(tmp_path):
    import subprocess

    slots = _slots(tmp_path, "a", "b")
    script = "import os; print('slot', os.environ['KERAS_REPLICATOR_SLOT'])"
    run = subprocess.run(
        [
            os.path.join(os.path.dirname(PY), "keras-replicator"),
            "launch",
            "-n",
            "3",
            "--min-workers",
            "1",
            "--discover",
            f"cat {slots}",
            "--",
            PY,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert sorted(ln.split()[-1] for ln in run.stdout.splitlines()) == ["a", "b"]


def test_a_group_that_is_finishing_is_not_resized(tmp_path):
    # Worker 0 is done when the slot comes back; worker 1 is still finishing:
    # a resize now would train again from scratch.
    slots = _slots(tmp_path, "a", "b")
    index = "int(os.environ['KERAS_REPLICATOR_WORKER_INDEX'])"
    finish = f"import os, time; time.sleep(2 * {index})"
    with _slots_later(slots, 1.0, "a", "b", "c"):
        result = launch(
            [PY, "-c", finish],
            3,
            min_workers=2,
            discover=f"cat {slots}",
            discover_seconds=0.2,
            timeout=60,
            echo=False,
        )
    assert result.ok and result.resizes == 0 and result.previous == ()
    assert len(result.workers) == 2


def test_a_slow_hook_does_not_hold_the_launch_back():
    calls = []

    def hook():
        calls.append(1)
        if len(calls) > 1:
            time.sleep(20)  # the background question hangs
        return ["a", "b"]

    started = time.monotonic()
    result = launch(
        [PY, "-c", "import time; time.sleep(0.5)"],
        2,
        discover=hook,
        discover_seconds=0.1,
        timeout=60,
        echo=False,
    )
    assert result.ok and time.monotonic() - started < 10


def test_waiting_in_vain_for_slots_after_a_failure_is_no_restart(tmp_path):
    slots = _slots(tmp_path, "a", "b")
    result = _run(
        tmp_path,
        slots,
        "lose",
        "1",
        "a",
        num_workers=2,
        min_workers=2,
        discover=f"cat {slots}",
        discover_seconds=0.2,
        max_restarts=3,
        timeout=3.0,
    )
    assert result.timed_out and result.workers == () and result.restarts == 0
    assert "before another group of workers started" in result.headline()
    (failed,) = result.previous
    assert failed.first_failure.returncode == 9
    assert result.total_seconds < 3.0 + 1.0  # the wait is not counted twice


def test_no_group_starts_after_the_deadline(tmp_path):
    # The slots change; the workers ignore SIGTERM, so stopping them takes the
    # resize's grace period, past the deadline: no new group is started then.
    slots = _slots(tmp_path, "a", "b")
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "time.sleep(60)"
    )
    with _slots_later(slots, 0.5, "a", "b", "c"):
        result = launch(
            [PY, "-c", stubborn],
            3,
            min_workers=2,
            discover=f"cat {slots}",
            discover_seconds=0.1,
            timeout=1.5,
            resize_grace_seconds=2,
            max_restarts=1,  # the SIGKILL at the grace's end makes it a restart
            echo=False,
        )
    assert result.timed_out and result.workers == ()
    assert [len(run.workers) for run in result.previous] == [2]


def test_an_older_answer_does_not_replace_a_newer_one():
    answers = iter([(0.5, ["a"]), (0.0, ["a", "b"])])

    def hook():
        delay, slots = next(answers)
        time.sleep(delay)
        return slots

    discovery = Discovery(hook, 1.0, echo=False)
    slow = threading.Thread(target=discovery.ask)
    slow.start()  # asked first, answers last
    time.sleep(0.1)
    assert discovery.ask() == ("a", "b")
    slow.join()
    assert discovery.latest == ("a", "b")
    assert Discovery(lambda: "x\ny\n", 1.0).ask() == ("x", "y")  # a string: lines


def test_a_signal_while_discovery_is_asked_stops_the_launch():
    """Before: `ask()` took the `StopSignal` for a failed question and the launch
    went on waiting for slots; later signals only printed a note."""
    discovery = Discovery(lambda: time.sleep(3) or ["a"], 1.0, echo=False)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    with stop_on_signals():
        timer.start()
        with pytest.raises(StopSignal):
            discovery.ask()
    timer.join()


@pytest.mark.parametrize(
    "answer, why",
    [
        ("head -c 3000000 /dev/zero | tr '\\0' a", "more than 1048576 bytes"),
        ("head -c 200000 /dev/zero | tr '\\0' a", "at most 4096 printable"),
        ("printf 'gpu0\\nbad\\0slot\\n'", "at most 4096 printable"),
    ],
)
def test_an_answer_too_long_or_with_a_control_character_is_a_failure(
    answer, why, capsys
):
    """Before: 64 MB of output was read whole; a slot over 128 KiB or with a NUL
    made starting the workers crash with OSError / ValueError."""
    discovery = Discovery("echo a", 1.0)
    assert discovery.ask() == ("a",)
    discovery.discover = answer
    assert discovery.ask() is None and discovery.latest == ("a",)
    err = capsys.readouterr().err
    assert why in err and "the slots stay as last known" in err
    assert Discovery(lambda: ["ok", "x" * 5000], 1.0, echo=False).ask() is None


def test_closing_discovery_kills_the_command_it_runs(tmp_path):
    """Before: `close()` left the shell and its child running, never reaped."""
    pids = tmp_path / "pids"
    discovery = Discovery(f"sleep 60 & echo $$ $! > {pids}; wait", 0.05, echo=False)
    discovery.start()
    while not pids.exists() or not pids.read_text().strip():
        time.sleep(0.02)
    discovery.close()
    assert _gone(*map(int, pids.read_text().split()))


# On SIGTERM the worker "backs up" for `seconds`, then says it was preempted and
# exits 0, as BackupAndRestore does; alone, it first announces a second slot.
SLOW_BACKUP = textwrap.dedent(
    """
    import os, signal, sys, time
    slots_file, seconds = sys.argv[1], float(sys.argv[2])
    env = os.environ

    def back_up(*_):
        time.sleep(seconds)
        with open(env["KERAS_REPLICATOR_PREEMPTED_FILE"], "w") as f:
            f.write("here")
        sys.exit(0)

    signal.signal(signal.SIGTERM, back_up)
    if env["KERAS_REPLICATOR_NUM_WORKERS"] == "1":
        with open(slots_file, "w") as f:
            f.write("a\\nb\\n")
        time.sleep(60)  # until the launcher resizes
    """
)


def _resize_with_backup(tmp_path, backup_seconds, **options):
    slots = _slots(tmp_path, "a")
    return launch(
        [PY, "-c", SLOW_BACKUP, slots, str(backup_seconds)],
        num_workers=2,
        min_workers=1,
        discover=f"cat {slots}",
        discover_seconds=0.2,
        grace_seconds=0.5,
        timeout=60,
        **options,
    )


def test_a_resize_waits_for_the_backup_with_its_own_grace(tmp_path):
    """Issue 49, item 8. Before: SIGKILL after `grace_seconds` (5 s), even in the
    middle of the backup at the agreed step."""
    result = _resize_with_backup(tmp_path, 2.0, resize_grace_seconds=20, echo=False)
    assert result.ok, result.describe_failure()
    assert (result.restarts, result.resizes) == (0, 1)
    (small,) = result.previous
    assert [w.returncode for w in small.workers] == [0] and small.preempted


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_a_resize_cut_short_by_its_grace_counts_as_a_restart(
    tmp_path, capfd, max_restarts
):
    """Before: still noted as "a backup at an agreed step" and not counted, so a
    flapping discovery could cut every backup and loop without bound."""
    started = time.monotonic()
    result = _resize_with_backup(
        tmp_path, 30.0, resize_grace_seconds=0.5, max_restarts=max_restarts
    )
    err = capfd.readouterr().err
    assert "may not have completed, which counts as a restart" in err
    assert result.resizes == 0
    if max_restarts:
        assert result.ok and result.restarts == 1, result.describe_failure()
        assert "(restart 1 of 1)" in err
    else:
        assert not result.ok and result.interrupted and "none is left" in err
        assert [w.returncode for w in result.workers] == [-signal.SIGKILL]
    assert time.monotonic() - started < 30


def test_sigterm_to_the_launcher_kills_the_discovery_command_it_runs(tmp_path):
    """Issue 49, item 9. Before: the command's shell and child outlived the
    launcher, never reaped."""
    import subprocess

    pids, started = tmp_path / "pids", tmp_path / "started"
    discover = (
        f"if [ -f {started} ]; then sleep 60 & echo $$ $! >> {pids}; wait; fi; "
        f"touch {started}; echo a"
    )
    launcher = subprocess.Popen(
        [
            os.path.join(os.path.dirname(PY), "keras-replicator"),
            "launch",
            "-n",
            "1",
            "--min-workers",
            "1",
            "--discover",
            discover,
            "--discover-seconds",
            "0.2",
            "--resize-grace-seconds",
            "5",
            "--",
            PY,
            "-c",
            "import time; time.sleep(60)",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not pids.exists() or not pids.read_text().strip():
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.05)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        launcher.kill()
        launcher.wait()
    assert _gone(*map(int, pids.read_text().split()))
