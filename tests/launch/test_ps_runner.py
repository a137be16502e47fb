"""Parameter-server jobs (`launch(..., num_ps=K)`): the chief decides, workers rejoin.

Plain Python processes stand in for the tasks (no TensorFlow), so these are fast.
The serving tasks below mimic `_ps_serving`: they block until SIGTERM, exit 0.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from keras_replicator.launch import launch
from tests.launch import _processes

PY = sys.executable

TASK = """
import json, os, signal, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
name = task["type"] + " " + str(task["index"])
if task["type"] != "chief":
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    print("serving", name, os.environ["KERAS_REPLICATOR_RESTART_COUNT"], flush=True)
    if name == os.environ.get("DIE") and not os.path.exists("died"):
        open("died", "w").close()
        os._exit(9)
    while True:
        time.sleep(1)
time.sleep(float(os.environ.get("CHIEF_SECONDS", "1")))
sys.exit(int(os.environ.get("CHIEF_CODE", "0")))
"""


def run(tmp_path, **env):
    return launch(
        [PY, "-c", TASK],
        2,
        num_ps=1,
        env={k: str(v) for k, v in env.items()},
        cwd=str(tmp_path),
        timeout=60,
        echo=False,
        grace_seconds=2.0,
    )


def test_the_chief_exit_code_is_the_job_and_the_servers_exit_zero(tmp_path):
    result = run(tmp_path)
    assert result.ok
    assert [w.label for w in result.workers] == [
        "chief",
        "worker 0",
        "worker 1",
        "ps 0",
    ]
    assert [w.returncode for w in result.workers] == [0, 0, 0, 0]
    assert all(w.stopped for w in result.workers[1:])


def test_a_failing_chief_fails_the_job(tmp_path):
    result = run(tmp_path, CHIEF_CODE=3)
    assert not result.ok
    assert result.first_failure.label == "chief"
    assert result.headline().startswith("chief exited with code 3")


def test_a_dead_worker_rejoins_and_the_job_continues(tmp_path):
    result = launch(
        [PY, "-c", TASK],
        2,
        num_ps=1,
        env={"DIE": "worker 1", "CHIEF_SECONDS": "4"},
        cwd=str(tmp_path),
        timeout=60,
        echo=False,
        grace_seconds=2.0,
        max_restarts=1,
    )
    assert result.ok, result.describe_failure()
    assert result.rejoins == 1
    # Both lives of worker 1 are in its output; the second one was stopped at the end.
    assert result.workers[2].output.count("serving worker 1") == 2
    assert result.workers[2].returncode == 0


def test_a_dead_worker_without_restarts_does_not_stop_the_job(tmp_path):
    result = run(tmp_path, DIE="worker 0", CHIEF_SECONDS=3)
    assert result.ok
    assert result.workers[1].returncode == 9 and not result.workers[1].stopped


def test_dry_run_lists_chief_workers_and_ps(capsys):
    launch(["python", "train.py"], 2, num_ps=1, dry_run=True)
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if "TF_CONFIG=" in line]
    tasks = [json.loads(line.split("TF_CONFIG=")[1])["task"] for line in lines]
    assert [(t["type"], t["index"]) for t in tasks] == [
        ("chief", 0),
        ("worker", 0),
        ("worker", 1),
        ("ps", 0),
    ]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_ps": -1}, "`num_ps` must be at least 0"),
        ({"num_ps": 1, "ports": [1, 2]}, "one port per task \\(4: the chief"),
    ],
)
def test_bad_ps_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        launch(["python", "train.py"], 2, dry_run=True, **kwargs)


def test_a_missing_program_is_a_one_line_error():
    done = subprocess.run(
        [
            PY,
            "-m",
            "keras_replicator.cli",
            "launch",
            "-n",
            "2",
            "--",
            "/no/such/program",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "`command[0]` must be an executable program" in done.stderr
    assert "'/no/such/program', which does not exist" in done.stderr


# Every task of the job records its pid and serves until SIGKILL (ignores SIGTERM).
SERVE_FOREVER = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close()\n"
    "time.sleep(120)\n"
)


def test_serving_tasks_do_not_outlive_a_sigkilled_launcher(tmp_path):
    """Before, the ps and worker tasks of a job whose launcher was SIGKILLed
    served forever (listening on all interfaces)."""
    launcher = subprocess.Popen(
        [PY, "-m", "keras_replicator.cli", "launch", "-n", "1", "--ps", "1"]
        + ["--grace-seconds", "1", "--timeout", "100"]
        + ["--", PY, "-c", SERVE_FOREVER, str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while len(os.listdir(tmp_path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(name) for name in os.listdir(tmp_path)]
    assert len(pids) == 3  # chief, worker 0, ps 0
    launcher.kill()
    launcher.wait(timeout=30)
    deadline = time.monotonic() + 15
    while any(_processes.alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [pid for pid in pids if _processes.alive(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"tasks {alive} outlived their launcher"
