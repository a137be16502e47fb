"""`keras-replicator launch`: output, exit codes, restarts, bad input."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.launch import _processes

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


# A worker that ignores every polite signal and records its pid: only SIGKILL ends it.
STUBBORN = (
    "import os, signal, sys, time\n"
    "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
    "    signal.signal(s, signal.SIG_IGN)\n"
    "open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close()\n"
    "time.sleep(120)\n"
)


def _start_stubborn_launcher(tmp_path, num_workers=2, grace="1"):
    launcher = subprocess.Popen(
        [PY, "-m", "keras_replicator.cli", "launch", "-n", str(num_workers)]
        + ["--grace-seconds", grace, "--timeout", "100"]
        + ["--", PY, "-c", STUBBORN, str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # signals go to the launcher only, as from `kill`
    )
    deadline = time.monotonic() + 60
    while len(os.listdir(tmp_path)) < num_workers and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(name) for name in os.listdir(tmp_path)]
    assert len(pids) == num_workers
    return launcher, pids


def _assert_all_gone(pids, within):
    deadline = time.monotonic() + within
    while any(_processes.alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [pid for pid in pids if _processes.alive(pid)]
    for pid in alive:  # do not leave them behind when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived their launcher"


@pytest.mark.parametrize(
    "signals, code",
    [
        ((signal.SIGHUP,), 128 + signal.SIGHUP),  # terminal closed, ssh dropped
        ((signal.SIGINT, signal.SIGINT), 130),  # a second Ctrl-C in the grace period
        ((signal.SIGTERM, signal.SIGINT, signal.SIGHUP), 128 + signal.SIGTERM),
    ],
    ids=["sighup", "double-sigint", "sigterm-then-more"],
)
def test_signals_stop_workers_that_ignore_sigterm(tmp_path, signals, code):
    """Before: SIGHUP killed the launcher and left the workers running; a second
    Ctrl-C skipped the SIGKILL and orphaned workers that ignore SIGTERM."""
    launcher, pids = _start_stubborn_launcher(tmp_path)
    for sig in signals:
        launcher.send_signal(sig)
        time.sleep(0.3)
    _, err = launcher.communicate(timeout=30)
    _assert_all_gone(pids, within=5)
    assert launcher.returncode == code, err
    assert "the workers were stopped" in err


def test_a_sigkilled_launcher_still_takes_its_workers_down(tmp_path):
    """The reaper: a launcher killed outright cannot stop its workers itself."""
    launcher, pids = _start_stubborn_launcher(tmp_path)
    launcher.kill()
    launcher.communicate(timeout=30)
    _assert_all_gone(pids, within=15)  # SIGTERM, 1 s grace, SIGKILL


def test_a_closed_stdout_neither_hangs_nor_stops_the_job():
    """`launch ... | head -1`: before, the echo thread died on EPIPE, the worker
    blocked on its full pipe and the job hung forever."""
    code = "for i in range(30000):\n    print('line', i, 'x' * 80)\n"
    launcher = subprocess.Popen(
        [PY, "-m", "keras_replicator.cli", "launch", "-n", "2", "--timeout", "100"]
        + ["--", PY, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert launcher.stdout.readline().startswith("[worker ")
        launcher.stdout.close()  # the reader goes away, like `head -1`
        launcher.wait(timeout=60)  # a few lines of stderr: its pipe cannot fill
        err = launcher.stderr.read()
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 0, err
    assert err.count("stdout was closed") == 1, err
    assert "Traceback" not in err and "BrokenPipeError" not in err


def _peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as file:
        for line in file:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_line_of_hundreds_of_megabytes_does_not_grow_the_launcher(tmp_path):
    """Before, the launcher held the whole line (3x its size as text) in memory."""
    code = (
        "import os, sys, time\n"
        "chunk = b'x' * 2**20\n"
        "for _ in range(200):\n"
        "    sys.stdout.buffer.write(chunk)\n"
        "sys.stdout.buffer.flush()\n"
        f"open({str(tmp_path / 'written')!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    launcher = subprocess.Popen(
        [PY, "-m", "keras_replicator.cli", "launch", "-n", "1", "--timeout", "100"]
        + ["--grace-seconds", "1", "--", PY, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "written").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "written").exists()
        time.sleep(0.5)  # the launcher drains the last pipe buffer
        peak = _peak_rss_mb(launcher.pid)
    finally:
        launcher.terminate()
        launcher.wait(timeout=30)
    assert peak < 80, f"launcher peaked at {peak:.0f} MB for a 200 MB line"


def test_an_ipv6_host_is_written_in_brackets():
    out = _cli("-n", "2", "--host", "::1", "--dry-run", "--", "python", "train.py")
    assert out.returncode == 0, out.stderr
    assert '"cluster": {"worker": ["[::1]:' in out.stdout
    assert '"::1:' not in out.stdout


@pytest.mark.parametrize(
    "host, message",
    [("a b", "the host 'a b' may only hold"), ("::1::2", "not an IPv6 address")],
)
def test_a_bad_host_is_a_usage_error(host, message):
    out = _cli("-n", "2", "--host", host, "--allow-remote", "--", PY, "-c", "pass")
    assert out.returncode == 2
    assert "`host` must be a host name" in out.stderr and message in out.stderr


def _with_four_gpus(tmp_path):
    """The environment of a machine whose (fake) `nvidia-smi` lists 4 GPUs."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nvidia-smi").write_text("#!/bin/sh\nprintf '0\\n1\\n2\\n3\\n'\n")
    (folder / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PATH"] = f"{folder}{os.pathsep}{env['PATH']}"
    return env


def test_dry_run_shows_each_workers_gpus(tmp_path):
    env = _with_four_gpus(tmp_path)
    out = _cli("-n", "2", "--dry-run", "--", "python", "train.py", env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[2].startswith("GPUs: 4 visible (nvidia-smi: 0,1,2,3); 2 per worker")
    assert lines[3].endswith("CUDA_VISIBLE_DEVICES='0,1'")
    assert lines[4].endswith("CUDA_VISIBLE_DEVICES='2,3'")
    out = _cli(
        "-n",
        "4",
        "--gpus-per-worker",
        "1",
        "--dry-run",
        "--",
        "python",
        "t.py",
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert [line.rpartition(" ")[2] for line in out.stdout.splitlines()[3:7]] == [
        f"CUDA_VISIBLE_DEVICES='{index}'" for index in range(4)
    ]


@pytest.mark.parametrize(
    "value, message",
    [
        ("3", "Received: gpus_per_worker=3, num_workers=2. Use gpus_per_worker=2"),
        ("two", "Received: gpus_per_worker='two'"),
        ("-1", "Received: gpus_per_worker=-1"),
    ],
)
def test_a_bad_gpus_per_worker_is_a_usage_error_before_anything_starts(
    tmp_path, value, message
):
    started = tmp_path / "started"
    code = f"open({str(started)!r}, 'a').close()"
    out = _cli(
        "-n", "2", "--gpus-per-worker", value, "--", PY, "-c", code,
        env=_with_four_gpus(tmp_path),
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "keras-replicator launch: error: `gpus_per_worker`" in out.stderr
    assert message in out.stderr
    assert not started.exists()
