"""Removing a run's processes and namespaces, and the leftovers of dead runs.

One routine serves both a cluster's own `close()` and the cleanup of runs whose
owner died without closing (SIGKILL, a pytest-timeout that exits the process):
it works from the names on the machine (`_names.py`), not from memory, so it
removes whatever part of a run exists, and running it twice is harmless.

The order matters: processes first (a namespace with a process in it outlives
its name), then the network namespaces, then the mount namespaces' files, then
the run directory that holds them.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence

from simulated_cluster import _names, _processes
from simulated_cluster._tools import run_tool

STALE_GRACE_SECONDS = 0.5


def remove_run(
    prefix: str,
    started: Sequence[subprocess.Popen] = (),
    grace_seconds: float = 2.0,
) -> None:
    """Stops the processes of run `prefix` and removes its namespaces.

    Args:
        prefix: The run's prefix, `kr<pid>c<serial>`.
        started: The processes the run started, signalled and reaped too.
            Defaults to none.
        grace_seconds: Seconds between SIGTERM and SIGKILL. Defaults to `2.0`.

    Raises:
        RuntimeError: Something could not be removed; every other step still ran.
    """
    directory = _names.run_directory(prefix)
    netns = _names.netns_of_run(prefix)
    mount_files = sorted(directory.glob("h*.mnt")) if directory.is_dir() else []
    namespace_files = [_names.NETNS_DIR / name for name in netns] + mount_files
    problems = []
    survivors = _processes.stop_processes(started, namespace_files, grace_seconds)
    if survivors:
        problems.append(f"processes {survivors} survived SIGKILL")
    mounted = _mount_points()
    steps = [("ip", "netns", "delete", name) for name in netns]
    for path in [*mount_files, directory]:
        if os.fspath(path) in mounted:
            steps.append(("umount", os.fspath(path)))
    for step in steps:
        try:
            run_tool(*step)
        except RuntimeError as error:
            problems.append(str(error))
    try:
        for path in mount_files:
            path.unlink(missing_ok=True)
        if directory.exists():
            directory.rmdir()
    except OSError as error:
        problems.append(str(error))
    if problems:
        raise RuntimeError(
            f"The simulated cluster {prefix} was not fully removed: "
            + "; ".join(problems)
            + ". Run `ip netns list` and `findmnt` to inspect what is left."
        )


def remove_stale_clusters() -> list[str]:
    """Removes what runs of processes that are no longer alive left behind.

    A run's namespaces and processes are left when its owner dies without
    closing it. A run is stale when no process has its owner's pid. Runs of live
    processes (this one included) are never touched.

    Returns:
        The prefixes of the runs removed.

    Raises:
        RuntimeError: A stale run could not be fully removed (the others were).

    Example:
    >>> isinstance(remove_stale_clusters(), list)
    True
    """
    removed, problems = [], []
    for prefix, owner in sorted(_names.prefixes_on_machine().items()):
        if _alive(owner):
            continue
        try:
            remove_run(prefix, grace_seconds=STALE_GRACE_SECONDS)
        except RuntimeError as error:
            problems.append(str(error))
        removed.append(prefix)
    if problems:
        raise RuntimeError(" ".join(problems))
    return removed


def _mount_points() -> set[str]:
    """This mount namespace's mount points (`os.path.ismount` skips files)."""
    with open("/proc/self/mountinfo") as mountinfo:
        lines = mountinfo.read().splitlines()
    # Field 5 is the mount point, with spaces and such escaped as octal.
    return {
        re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
        for line in lines
    }


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie has finished: its run is stale)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
