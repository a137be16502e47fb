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
holder first. The names are computable, so only a real directory this user
owns (not a link, not another user's) is taken for a leftover: a "holder"
planted in a shared directory never moves a file into the save's path.
Everything happens in the save's open, checked directory (`dir_fd`,
`trusted_dirs`), never by path.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import stat
import threading
import time
import uuid

from keras_replicator._files.trusted_dirs import remove_tree_at

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


def recover(directory: str, name: str, *, dir_fd: int | None = None) -> None:
    """Cleans up after earlier saves of `directory/name` that were killed.

    If the path is missing but a killed save left the previous version in a
    `.kr-old-` holder, that version is restored; then every staging or holder
    directory of this name whose writer is gone is deleted. Only directories
    this user made count (a real directory it owns, not a link): a "holder"
    planted by another user in a shared directory is left alone, never
    restored from. `dir_fd`, an open descriptor of `directory`, is used
    instead of its path when given.
    """
    if dir_fd is None:
        opened = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            recover(directory, name, dir_fd=opened)
        finally:
            os.close(opened)
        return
    leftovers = _stale_leftovers(dir_fd, name)
    if not _exists(name, dir_fd):
        holders = [h for h in leftovers if h.startswith(OLD_MARKER)]
        for holder in sorted(holders, key=lambda h: -_mtime(h, dir_fd)):
            with contextlib.suppress(OSError), _opened(holder, dir_fd) as inside:
                if _exists(name, inside):
                    os.replace(name, name, src_dir_fd=inside, dst_dir_fd=dir_fd)
                    break
    for leftover in leftovers:
        remove_tree_at(dir_fd, leftover)


def leftover_name(kind: str, name: str) -> str:
    """A new staging (`kind="tmp"`) or holder (`"old"`) name for `name`."""
    return (
        f".kr-{kind}-{_short_hash(name, 8)}-{_short_hash(socket.gethostname(), 4)}"
        f"-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    )


def _short_hash(text: str, length: int) -> str:
    digest = hashlib.blake2s(os.fsencode(text), digest_size=length // 2)
    return digest.hexdigest()


def make_leftover_dir(dir_fd: int, kind: str, name: str) -> str:
    """Creates a staging (`kind="tmp"`) or holder (`"old"`) directory, in use.

    It is made in the open directory `dir_fd`, private to this user (mode
    0o700); its name is returned.
    """
    entry = leftover_name(kind, name)
    with _active_lock:
        _active.add(entry)  # before it exists
    try:
        os.mkdir(entry, 0o700, dir_fd=dir_fd)
    except BaseException:
        with _active_lock:
            _active.discard(entry)
        raise
    return entry


def release(dir_fd: int, entry: str) -> None:
    """Deletes a directory `make_leftover_dir` made; it is no longer in use."""
    remove_tree_at(dir_fd, entry)
    forget(entry)


def forget(entry: str) -> None:
    """Marks `entry` as no longer in use, so a later save may remove it."""
    with _active_lock:
        _active.discard(os.path.basename(entry))


@contextlib.contextmanager
def _opened(entry: str, dir_fd: int):
    descriptor = os.open(
        entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd
    )
    try:
        yield descriptor
    finally:
        os.close(descriptor)


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _mtime(entry: str, dir_fd: int) -> float:
    return os.stat(entry, dir_fd=dir_fd, follow_symlinks=False).st_mtime


def _ours(entry: str, dir_fd: int) -> bool:
    """Whether `entry` is a real directory (not a link) this user owns."""
    try:
        status = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    owner_ok = not hasattr(os, "geteuid") or status.st_uid == os.geteuid()
    return stat.S_ISDIR(status.st_mode) and owner_ok


def _stale_leftovers(dir_fd: int, name: str) -> list[str]:
    """This name's staging / holder directories (ours) whose writer is gone."""
    name_hash = _short_hash(name, 8)
    host = _short_hash(socket.gethostname(), 4)
    stale = []
    try:
        entries = os.listdir(dir_fd)
    except OSError:
        return stale
    legacy_prefix = f".{name}{TEMP_MARKER}"
    for entry in entries:
        match = _LEFTOVER.match(entry)
        if entry.startswith(legacy_prefix):
            match = _LEGACY_SUFFIX.match(entry[len(legacy_prefix) :])
            if match:
                match = {"name": name_hash, "host": host, "pid": match["pid"]}
        if not match or match["name"] != name_hash or not _ours(entry, dir_fd):
            continue
        if match["host"] == host:
            with _active_lock:
                in_use = entry in _active
            if in_use or _is_running(int(match["pid"])):
                continue
        else:
            with contextlib.suppress(OSError):
                if time.time() - _mtime(entry, dir_fd) < OTHER_HOST_STALE_SECONDS:
                    continue
        stale.append(entry)
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
