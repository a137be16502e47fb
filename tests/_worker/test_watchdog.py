"""`exit_with_launcher()`: a serving task ends when its launcher is gone."""

import os
import signal
import subprocess
import sys
import time

from keras_replicator._environment import LAUNCHER_PID
from keras_replicator._worker import watchdog
from tests.launch import _processes

# A serving task as `_ps_serving` runs one: exits 0 on SIGTERM, else sleeps forever.
TASK = (
    "import os, signal, sys, time\n"
    "from keras_replicator._worker.watchdog import exit_with_launcher\n"
    "signal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n"
    "assert exit_with_launcher(poll_seconds=0.1)\n"
    "print(os.getpid(), flush=True)\n"
    "time.sleep(60)\n"
)

# Stands in for the launcher: starts the task, prints its pid, waits to be killed.
LAUNCHER = (
    "import os, subprocess, sys, time\n"
    "env = dict(os.environ, KERAS_REPLICATOR_LAUNCHER_PID=str(os.getpid()))\n"
    "task = subprocess.Popen([sys.executable, '-c', sys.argv[1]], env=env,\n"
    "                        stdout=subprocess.PIPE, start_new_session=True)\n"
    "print(task.stdout.readline().decode().strip(), flush=True)\n"
    "time.sleep(60)\n"
)


def test_the_task_exits_when_its_launcher_is_killed():
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, TASK], stdout=subprocess.PIPE, text=True
    )
    task = int(launcher.stdout.readline())
    try:
        assert _processes.alive(task)
        launcher.kill()  # SIGKILL: no chance to stop the task itself
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _processes.alive(task) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _processes.alive(task), "the serving task outlived its launcher"
    finally:
        if _processes.alive(task):
            os.kill(task, signal.SIGKILL)


def test_a_live_launcher_keeps_the_task():
    assert watchdog.launcher_alive(os.getppid(), is_parent=True)
    assert watchdog.launcher_alive(os.getpid(), is_parent=False)
    assert not watchdog.launcher_alive(2**22 + 1, is_parent=False)


def test_outside_a_launcher_nothing_starts():
    assert not watchdog.exit_with_launcher(environ={})
    assert not watchdog.exit_with_launcher(environ={LAUNCHER_PID: "١٢"})
