"""Staging and holder directories: their names, and the leftovers of killed saves.

A save stages its output in `.kr-tmp-<name hash>-<host>-<pid>-<token>` next to the
target, and a directory being replaced in two steps waits in a
`.kr-old-<name hash>-<host>-<pid>-<token>/` holder (`atomic_publish`). These
names do not grow with the target's name (under 40 characters), so every name
the filesystem accepts (up to NAME_MAX, 255 bytes) can be saved; a suffix on the
name would overflow it.

Each save to a path first removes that path's staging and holder directories
left by writers that are gone (`recover`): same host and a pid that no longer
runs (this process's own only when no write of it is using them), or another
host and untouched for a day (a pid means nothing across hosts on a shared
filesystem). A live writer's are kept. If a hard kill came between the two
steps of a directory's replacement, the previous version is restored from its
holder first.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import threading
import time
import uuid

TEMP_MARKER = ".kr-tmp-"
OLD_MARKER = ".kr-old-"
# Another host's leftovers cannot be checked for a live writer: kept this long.
OTHER_HOST_STALE_SECONDS = 24 * 3600

_LEFTOVER = re.compile(
    r"^\.kr-(?P<kind>tmp|old)-(?P<name>[0-9a-f]{8})-(?P<host>[0-9a-f]{4})"
    r"-(?P<pid>\d+)-[0-9a-f]{8}$"
)
# Earlier versions staged in `.<name>.kr-tmp-<pid>-<token>` (too long for long
# names); a killed save's is still removed by the next save of `<name>`.
_LEGACY_SUFFIX = re.compile(r"^(?P<pid>\d+)-[0-9a-f]{8}$")

# Names (unique by their token) of this process's staging and holder directories
# in use, so a concurrent save from another thread never takes one for a leftover.
_active: set[str] = set()
_active_lock = threading.Lock()


def recover(directory: str, name: str) -> None:
    """Cleans up after earlier saves of `directory/name` that were killed.

    If the path is missing but a killed save left the previous version in a
    `.kr-old-` holder, that version is restored; then every staging or holder
    directory of this name whose writer is gone is deleted.
    """
    target = os.path.join(directory, name)
    leftovers = _stale_leftovers(directory, name)
    if not os.path.lexists(target):
        holders = [
            holder
            for holder in leftovers
            if os.path.basename(holder).startswith(OLD_MARKER)
            and os.path.lexists(os.path.join(holder, name))
        ]
        if holders:
            newest = max(holders, key=os.path.getmtime)
            os.replace(os.path.join(newest, name), target)
    for leftover in leftovers:
        shutil.rmtree(leftover, ignore_errors=True)


def leftover_name(kind: str, name: str) -> str:
    """A new staging (`kind="tmp"`) or holder (`"old"`) name for `name`."""
    return (
        f".kr-{kind}-{_short_hash(name, 8)}-{_short_hash(socket.gethostname(), 4)}"
        f"-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    )


def _short_hash(text: str, length: int) -> str:
    digest = hashlib.blake2s(os.fsencode(text), digest_size=length // 2)
    return digest.hexdigest()


def make_leftover_dir(directory: str, kind: str, name: str) -> str:
    """Creates a staging (`kind="tmp"`) or holder (`"old"`) directory, in use."""
    path = os.path.join(directory, leftover_name(kind, name))
    with _active_lock:
        _active.add(os.path.basename(path))  # before it exists
    try:
        os.mkdir(path)
    except BaseException:
        with _active_lock:
            _active.discard(os.path.basename(path))
        raise
    return path


def release(path: str) -> None:
    """Deletes a directory `make_leftover_dir` made; it is no longer in use."""
    shutil.rmtree(path, ignore_errors=True)
    forget(path)


def forget(path: str) -> None:
    """Marks `path` as no longer in use, so a later save may remove it."""
    with _active_lock:
        _active.discard(os.path.basename(path))


def _stale_leftovers(directory: str, name: str) -> list[str]:
    """This name's staging / holder directories whose writer is gone."""
    name_hash = _short_hash(name, 8)
    host = _short_hash(socket.gethostname(), 4)
    stale = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return stale
    legacy_prefix = f".{name}{TEMP_MARKER}"
    for entry in entries:
        match = _LEFTOVER.match(entry)
        if entry.startswith(legacy_prefix):
            match = _LEGACY_SUFFIX.match(entry[len(legacy_prefix) :])
            if match:
                match = {"name": name_hash, "host": host, "pid": match["pid"]}
        if not match or match["name"] != name_hash:
            continue
        path = os.path.join(directory, entry)
        if match["host"] == host:
            with _active_lock:
                in_use = entry in _active
            if in_use or _is_running(int(match["pid"])):
                continue
        else:
            with contextlib.suppress(OSError):
                if time.time() - os.path.getmtime(path) < OTHER_HOST_STALE_SECONDS:
                    continue
        stale.append(path)
    return stale


def _is_running(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours, and `_active` says no write uses it
    if os.name != "posix" or pid <= 0:
        return True  # cannot tell: keep it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # e.g. another user's process
    return True
