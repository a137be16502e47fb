"""The reaper stops registered process groups when its launcher's pipe closes."""

import os
import signal
import subprocess
import sys
import time

from keras_replicator.launch._reaper import Reaper

IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)"
)


def _stubborn():
    process = subprocess.Popen(
        [sys.executable, "-c", IGNORES_SIGTERM],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdout.readline() == b"ready\n"
    return process


def test_a_registered_group_is_killed_when_the_launcher_goes():
    worker = _stubborn()
    reaper = Reaper()
    try:
        reaper.watch(worker.pid, 0.5)
        started = time.monotonic()
        reaper.close()  # EOF, as when the launcher dies
        assert worker.wait(timeout=20) == -signal.SIGKILL
        assert time.monotonic() - started >= 0.4  # SIGTERM first, then the grace
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


def test_a_forgotten_group_is_left_alone():
    worker = _stubborn()
    reaper = Reaper()
    try:
        reaper.watch(worker.pid, 0.1)
        reaper.forget(worker.pid)
        reaper.close()
        time.sleep(0.5)
        assert worker.poll() is None
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
