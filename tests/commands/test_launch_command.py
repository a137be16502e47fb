"""`keras-replicator launch`: output, exit codes, restarts, bad input."""

import os
import signal
import subprocess
import sys
import time

import pytest

PY = sys.executable


def _cli(*args, timeout=120, env=None):
    return subprocess.run(
        [PY, "-m", "keras_replicator.cli", "launch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_output_is_prefixed_and_success_is_zero():
    out = _cli("-n", "2", "--", PY, "-c", "print('hello')")
    assert out.returncode == 0, out.stderr
    assert "[worker 0] hello" in out.stdout and "[worker 1] hello" in out.stdout


def test_the_first_failure_gives_its_exit_code_and_traceback():
    code = (
        "import os, time\n"
        "if os.environ['KERAS_REPLICATOR_WORKER_INDEX'] == '1':\n"
        "    raise KeyError('missing shard')\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    out = _cli("-n", "2", "--grace-seconds", "1", "--", PY, "-c", code)
    assert time.monotonic() - started < 30  # worker 0 was stopped, not awaited
    assert out.returncode == 1
    assert "worker 1 exited with code 1" in out.stderr
    assert "the launcher stopped worker(s) [0]" in out.stderr
    assert "--- worker 1, last output ---\nTraceback" in out.stderr
    assert "KeyError: 'missing shard'" in out.stderr


def test_a_worker_killed_by_a_signal_gives_128_plus_the_signal():
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    out = _cli("-n", "2", "--", PY, "-c", code)
    assert out.returncode == 128 + signal.SIGKILL
    assert "SIGKILL" in out.stderr


def test_timeout_gives_124():
    out = _cli(
        "-n",
        "2",
        "--timeout",
        "1",
        "--grace-seconds",
        "1",
        "--",
        PY,
        "-c",
        "import time; time.sleep(60)",
    )
    assert out.returncode == 124
    assert "timed out" in out.stderr


def test_max_restarts_restarts_the_group():
    code = (
        "import os\n"
        "print('run', os.environ['KERAS_REPLICATOR_RESTART_COUNT'])\n"
        "if os.environ['KERAS_REPLICATOR_RESTART_COUNT'] == '0':\n"
        "    raise SystemExit(4)\n"
    )
    out = _cli("-n", "2", "--max-restarts", "2", "--", PY, "-c", code)
    assert out.returncode == 0, out.stderr
    # Both workers fail in run 0; whichever fails first stops the other, possibly
    # before it printed. Run 1 completes on both.
    assert "] run 0" in out.stdout
    assert "[worker 0] run 1" in out.stdout and "[worker 1] run 1" in out.stdout
    assert "Restarting all 2 workers (restart 1 of 2)" in out.stderr
    assert "succeeded after 1 restart(s)" in out.stderr


def test_dry_run_prints_every_tf_config():
    out = _cli("-n", "2", "--dry-run", "--", "python", "train.py", "--lr", "0.1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == ["mode: local", "command: python train.py --lr 0.1"]
    assert lines[2].startswith(
        '[worker 0] TF_CONFIG={"cluster": {"worker": ["127.0.0.1:'
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["-n", "0"], "Received: num_workers=0"),
        (["-n", "2", "--max-restarts", "-1"], "Received: max_restarts=-1"),
        (["-n", "2", "--host", "10.0.0.9"], "--allow-remote"),
        (["-n", "2", "--ports", "5000"], "one port per worker (2)"),
        (["--cluster", "tf-config"], "`TF_CONFIG` must be set"),
        ([], "`num_workers` is required"),
        (["-n", "2", "--", "no-such-program-kr"], "command[0]"),
    ],
)
def test_bad_input_is_a_usage_error(args, message):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    if "--" not in args:
        args = [*args, "--", PY, "-c", "pass"]
    out = _cli(*args, env=env)
    assert out.returncode == 2
    assert "keras-replicator launch: error:" in out.stderr
    assert message in out.stderr


def test_allow_remote_warns_about_grpc():
    out = _cli(
        "-n",
        "2",
        "--host",
        "192.0.2.1",
        "--allow-remote",
        "--dry-run",
        "--",
        "python",
        "train.py",
    )
    assert out.returncode == 0, out.stderr
    assert "no authentication" in out.stderr
    assert '"192.0.2.1:' in out.stdout


@pytest.mark.parametrize(
    "sig, code", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130)]
)
def test_stopping_the_launcher_stops_the_workers(tmp_path, sig, code):
    worker = (
        "import os, sys, time\n"
        f"open(os.path.join({str(tmp_path)!r}, str(os.getpid())), 'w').close()\n"
        "time.sleep(120)\n"
    )
    launcher = subprocess.Popen(
        [
            PY,
            "-m",
            "keras_replicator.cli",
            "launch",
            "-n",
            "2",
            "--grace-seconds",
            "2",
            "--",
            PY,
            "-c",
            worker,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(name) for name in os.listdir(tmp_path)]
    assert len(pids) == 2
    launcher.send_signal(sig)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == code
    assert "the workers were stopped" in err
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
