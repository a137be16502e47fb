"""The reaper: stops the workers when their launcher dies without stopping them.

The launcher stops its workers on any signal it can catch (`_signals.py`), but
not on SIGKILL, the OOM killer, or a crash of the interpreter; and the workers
live in sessions of their own, so nothing else would stop them. An asynchronous
parameter-server job is the worst case: its ps and worker tasks serve forever,
listening on all interfaces.

So the launcher keeps a small companion process, started on first use and shared
by every run of this process: `python -I .../_reaper.py`, in a session of its own
(a Ctrl-C or a signal to the launcher's process group does not reach it), with
its stdin a pipe from the launcher. The launcher writes `+PGID GRACE` when it
starts a worker (each worker leads its own process group) and `-PGID` when it has
stopped and reaped it. Only the launcher holds the pipe's write end (the workers
do not inherit it), so EOF on the reaper's stdin means the launcher is gone: the
reaper then sends SIGTERM to every group still registered, and SIGKILL after the
grace period to what remains. When the launcher exits normally, every group has
been unregistered and the reaper just exits.

This arms the watchdog from the launcher's side, for any worker program (not only
Python). `_worker.watchdog.exit_with_launcher()` is the worker-side complement for tasks
that must not outlive their launcher even when the reaper is killed with it.

The file runs as a plain script (its own path, `-I`), so it imports nothing but
the standard library.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

_POLL_SECONDS = 0.1


class Reaper:
    """The launcher's handle on its reaper process (one per launcher process).

    Example:
    >>> reaper = Reaper()
    >>> reaper.watch(2**22 + 1, 1.0)  # a group id no process has
    >>> reaper.forget(2**22 + 1)
    >>> reaper.close()
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None

    def watch(self, pgid: int, grace_seconds: float) -> None:
        """Stop process group `pgid` if this process dies before `forget(pgid)`."""
        self._send(f"+{pgid} {float(grace_seconds)!r}\n")

    def forget(self, pgid: int) -> None:
        """The launcher has stopped and reaped group `pgid` itself."""
        self._send(f"-{pgid}\n")

    def close(self) -> None:
        """Ends the reaper (it stops any group still registered)."""
        with self._lock:
            if self._process is not None:
                self._process.stdin.close()
                self._process.wait()
                self._process = None

    def _send(self, line: str) -> None:
        with self._lock:
            # Best effort: the reaper is a safety net, never a reason to fail a run.
            try:
                if self._process is None or self._process.poll() is not None:
                    self._process = subprocess.Popen(
                        [sys.executable, "-I", os.path.abspath(__file__)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                        text=True,
                    )
                self._process.stdin.write(line)
                self._process.stdin.flush()
            except OSError:
                self._process = None


REAPER = Reaper()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _kill_groups(groups, sig) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    groups: dict[int, float] = {}
    for line in sys.stdin:
        kind, _, rest = line.strip().partition(" ")
        try:
            if kind.startswith("+"):
                groups[int(kind[1:])] = float(rest or 5.0)
            elif kind.startswith("-"):
                groups.pop(int(kind[1:]), None)
        except ValueError:
            continue
    if not groups:
        return 0
    _kill_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + max(groups.values())
    while time.monotonic() < deadline and any(_group_alive(g) for g in groups):
        time.sleep(_POLL_SECONDS)
    _kill_groups(groups, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
