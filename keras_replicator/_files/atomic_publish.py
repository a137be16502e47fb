"""Publishing what a save wrote at the user's path in one step.

`write_atomically(path, write)` has `write` produce its output in a hidden staging
directory next to `path` (same filesystem), then renames it into place: a reader
sees the previous version or the new one, never half of one. Decisions:

- **Only directories no other user can change, used through descriptors.**
  Every directory on the path must be the caller's or root's and writable by
  nobody else (a sticky one like `/tmp` aside); staging is private (0o700), and
  staging, renaming and cleaning up go through open directory descriptors
  (`dir_fd=`, `O_NOFOLLOW`), so nothing can be swapped for a symlink while a
  save runs (`trusted_dirs`).
- **Staging names do not grow with the name**, and a killed save's leftovers
  are removed by the next save of that path (`leftovers`).
- **Symlinks are followed only when they are the caller's own** (`links`): the
  target of a trusted link is replaced, with staging next to it; the link
  stays a link.
- **A file never replaces a directory.** A save whose output is a file, at a
  path holding a directory, is an error (as `open(path, "w")` is): no directory
  tree is ever removed because a file path was saved.
- **A directory is never missing.** An unzipped `.keras`, a SavedModel export or
  anything else written as a directory cannot be renamed over a non-empty
  directory. On Linux, `renameat2(RENAME_EXCHANGE)` swaps the new and the old in
  one step and the old is deleted afterwards. Elsewhere (or on filesystems
  without it) the old version is first renamed into a `.kr-old-` holder, the new
  one renamed in, then the holder deleted; an error in between renames the old
  one back, and after a hard kill in between the next save to the path restores
  it first (`leftovers.recover`).

Hand-written because the standard library has `os.replace` but no exchange,
and no maintained library publishes Keras' outputs (a directory, or sharded
weights whose index must appear last) with this recovery.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
import sys
from collections.abc import Callable

from keras_replicator._files.leftovers import (
    TEMP_MARKER,
    forget,
    make_leftover_dir,
    recover,
    release,
)
from keras_replicator._files.links import check_trusted_link
from keras_replicator._files.trusted_dirs import open_parent

__all__ = [
    "TEMP_MARKER",
    "check_trusted_link",
    "recover",
    "write_atomically",
]

_RENAME_EXCHANGE = 2
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def write_atomically(
    path,
    write: Callable[[str], None],
    *,
    single_file_only: bool = False,
    argument: str = "filepath",
    received: str | None = None,
) -> None:
    """Calls `write(p)` for a staged `p`, then renames what it wrote to `path`.

    `write` may produce a file, a directory, or several files next to `p`
    (sharded weights: the file named like `path` is published last, so a reader
    that finds it finds its shards). If `write` fails or the process dies, `path`
    keeps its previous content; the staging directory is removed (after a hard
    kill, by the next save to `path`). A symlink at `path` is followed (its
    target is replaced) only if it is the caller's own (`check_trusted_link`);
    a file is never published over a directory. With `single_file_only`,
    anything but one regular file named like `path` is discarded instead of
    published (a non-chief's copy of a directory). Every directory on the path
    must be one no other user can change (`trusted_dirs`; `argument` names
    the user's argument in that error, `received` what it was if not `path`),
    and staging and publishing go through its open descriptor.

    Example:
    >>> import os, tempfile
    >>> from keras_replicator._files.atomic_publish import (
    ...     write_atomically)
    >>> path = os.path.join(tempfile.mkdtemp(), "note.txt")
    >>> write_atomically(path, lambda p: open(p, "w").write("saved"))
    >>> open(path).read(), os.listdir(os.path.dirname(path))
    ('saved', ['note.txt'])
    """
    path = os.fspath(path)
    if "://" in path:
        write(path)
        return
    directory_fd, directory, name = open_parent(
        path, argument=argument, received=received
    )
    try:
        recover(directory, name, dir_fd=directory_fd)
        staging = make_leftover_dir(directory_fd, "tmp", name)
        try:
            staging_fd = os.open(staging, _DIRECTORY, dir_fd=directory_fd)
            try:
                _stage_and_publish(
                    write,
                    staging_fd,
                    os.path.join(directory, staging),
                    directory_fd,
                    directory,
                    name,
                    single_file_only,
                )
            finally:
                os.close(staging_fd)
        finally:
            release(directory_fd, staging)
    finally:
        os.close(directory_fd)


def _stage_and_publish(
    write, staging_fd, staging, directory_fd, directory, name, single_file_only
) -> None:
    # `staging` is a path through directories only this user or root can
    # change (checked), so `write`, which needs a path, cannot be redirected.
    write(os.path.join(staging, name))
    # The file named like `path` (or a sharded save's `.weights.json`)
    # indexes the others: publish it last.
    written = sorted(
        os.listdir(staging_fd),
        key=lambda entry: (entry == name or entry.endswith(".json"), entry),
    )
    if single_file_only and (
        written != [name] or not stat.S_ISREG(_lstat(name, staging_fd).st_mode)
    ):
        return
    for entry in written:
        _publish(staging_fd, entry, directory_fd, directory, entry)
    _fsync(directory_fd)


def _lstat(name: str, dir_fd: int) -> os.stat_result:
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def _publish(
    staging_fd: int, source: str, directory_fd: int, directory: str, name: str
) -> None:
    source_is_directory = stat.S_ISDIR(_lstat(source, staging_fd).st_mode)
    if source_is_directory:
        for _, _, files, folder in os.fwalk(source, dir_fd=staging_fd):
            for file in files:
                _fsync_at(file, folder)
    else:
        _fsync_at(source, staging_fd)
    try:
        target_is_directory = stat.S_ISDIR(_lstat(name, directory_fd).st_mode)
        target_exists = True
    except FileNotFoundError:
        target_is_directory = target_exists = False
    if target_is_directory and not source_is_directory:
        raise IsADirectoryError(
            errno.EISDIR,
            f"Cannot save a file to {os.path.join(directory, name)!r}: a directory "
            "is there, and a save never removes a directory to put a file in its "
            "place. Remove the directory first, or save to another path.",
        )
    if not (source_is_directory or target_is_directory) or not target_exists:
        # one atomic rename
        os.replace(source, name, src_dir_fd=staging_fd, dst_dir_fd=directory_fd)
        return
    if _exchange(staging_fd, source, directory_fd, name):
        return  # the old version is now in the staging, deleted with it
    _replace_in_two_steps(staging_fd, source, directory_fd, name)


def _replace_in_two_steps(
    staging_fd: int, source: str, directory_fd: int, name: str
) -> None:
    """Old version to a holder, new one in, holder deleted (see module doc)."""
    holder = make_leftover_dir(directory_fd, "old", name)
    try:
        holder_fd = os.open(holder, _DIRECTORY, dir_fd=directory_fd)
        try:
            os.replace(name, name, src_dir_fd=directory_fd, dst_dir_fd=holder_fd)
            try:
                os.replace(source, name, src_dir_fd=staging_fd, dst_dir_fd=directory_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.replace(
                        name, name, src_dir_fd=holder_fd, dst_dir_fd=directory_fd
                    )
                raise
        finally:
            os.close(holder_fd)
    except BaseException:
        forget(holder)  # kept if it holds the old version
        with contextlib.suppress(OSError):
            os.rmdir(holder, dir_fd=directory_fd)
        raise
    release(directory_fd, holder)


def _exchange(source_fd: int, source: str, target_fd: int, target: str) -> bool:
    """Swaps two entries in one step (Linux `renameat2`); False where unsupported."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    result = renameat2(
        source_fd,
        os.fsencode(source),
        target_fd,
        os.fsencode(target),
        _RENAME_EXCHANGE,
    )
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EPERM, errno.EOPNOTSUPP):
        return False  # old kernel, filesystem without it, or a sandbox refusing
    raise OSError(code, os.strerror(code), source, None, target)


_renameat2_function: list = []


def _renameat2():
    if not _renameat2_function:
        function = None
        if sys.platform.startswith("linux"):
            try:
                function = ctypes.CDLL(None, use_errno=True).renameat2
            except (OSError, AttributeError):  # libc older than glibc 2.28
                function = None
            else:
                function.argtypes = [
                    ctypes.c_int,
                    ctypes.c_char_p,
                    ctypes.c_int,
                    ctypes.c_char_p,
                    ctypes.c_uint,
                ]
                function.restype = ctypes.c_int
        _renameat2_function.append(function)
    return _renameat2_function[0]


def _fsync_at(name: str, dir_fd: int) -> None:
    """Flushes the file `name` in the open directory `dir_fd` before it is published.

    A file the OS cannot flush (EIO, ENOSPC: its data may never reach the disk)
    fails the save here, before the rename: the previous version stays. Only a
    filesystem without fsync (EINVAL, ENOTSUP) passes.
    """
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError as error:
        if error.errno in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            return
        raise OSError(
            error.errno,
            f"Could not flush {name!r} to disk before publishing it ({error}); "
            "the save was not published and the previous version stays. Check "
            "the disk (free space, errors in the kernel log), then save again",
        ) from error
    finally:
        os.close(descriptor)


def _fsync(descriptor: int) -> None:
    """Flushes an open file (or a directory's entries) to disk, if the OS allows."""
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename still holds
