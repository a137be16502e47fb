"""Stopping every process of a simulated host: SIGTERM, a grace period, SIGKILL.

Tracking the processes the harness started is not enough: a worker may start
children that leave its process group (`setsid`, a daemon), and a crashed run
leaves processes nobody tracks. Every one of them lives in a host's network or
mount namespace, so the namespaces themselves say what to stop: a process belongs
to a host when its `/proc/<pid>/ns/net` or `/proc/<pid>/ns/mnt` is the same
namespace (device and inode) as the host's namespace file. Nothing else ever
enters those namespaces. The tracked `Popen` objects are signalled too (their
whole group), as `nsenter` may not have entered the namespaces yet, and reaped,
so no zombie stays behind.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence

KILL_WAIT_SECONDS = 5.0
_POLL_SECONDS = 0.02


def pids_in_namespaces(namespace_files: Iterable[pathlib.Path]) -> set[int]:
    """The processes that are inside any of these namespaces.

    Args:
        namespace_files: Files that keep namespaces: `/var/run/netns/<name>`, or
            a mount namespace bound by `unshare --mount=<file>`. Missing files
            are ignored.

    Returns:
        The process ids, zombies excluded (they have left their namespaces).

    Example:
    >>> pids_in_namespaces([pathlib.Path("/proc/self/ns/net")]) != set()
    True
    """
    wanted = set()
    for path in namespace_files:
        try:
            status = os.stat(path)
        except OSError:
            continue
        wanted.add((status.st_dev, status.st_ino))
    if not wanted:
        return set()
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        for kind in ("net", "mnt"):
            try:
                status = os.stat(f"/proc/{entry.name}/ns/{kind}")
            except OSError:  # gone, or a zombie
                break
            if (status.st_dev, status.st_ino) in wanted:
                found.add(int(entry.name))
                break
    return found


def stop_processes(
    started: Sequence[subprocess.Popen],
    namespace_files: Sequence[pathlib.Path],
    grace_seconds: float,
) -> list[int]:
    """Stops the processes started and every process inside the namespaces.

    Args:
        started: Processes started in their own session (`start_new_session`);
            their groups are signalled and they are reaped.
        namespace_files: The namespaces whose processes are stopped.
        grace_seconds: Seconds between SIGTERM and SIGKILL.

    Returns:
        The ids of the processes still alive `KILL_WAIT_SECONDS` after SIGKILL
        (normally none: a process in uninterruptible sleep can outlive it).
    """
    for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, None)):
        remaining = _remaining(started, namespace_files)
        if not remaining:
            return []
        _signal(started, remaining, sig)
        deadline = time.monotonic() + (KILL_WAIT_SECONDS if wait is None else wait)
        while remaining and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
            remaining = _remaining(started, namespace_files)
    return sorted(remaining)


def _remaining(started, namespace_files) -> set[int]:
    alive = {process.pid for process in started if process.poll() is None}
    return alive | pids_in_namespaces(namespace_files)


def _signal(started, pids, sig) -> None:
    for process in started:
        # Only while unreaped is the process's pid certainly still its group id.
        if process.returncode is None:
            _ignore_gone(os.killpg, process.pid, sig)
    for pid in pids:
        _ignore_gone(os.kill, pid, sig)


def _ignore_gone(send, target, sig) -> None:
    try:
        send(target, sig)
    except ProcessLookupError:
        pass
