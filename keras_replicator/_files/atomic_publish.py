"""Publishing what a save wrote at the user's path in one step.

`write_atomically(path, write)` has `write` produce its output in a hidden staging
directory next to `path` (same filesystem), then renames it into place: a reader
sees the previous version or the new one, never half of one. Decisions:

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
import sys
from collections.abc import Callable

from keras_replicator._files.leftovers import (
    TEMP_MARKER,
    forget,
    make_leftover_dir,
    recover,
    release,
)
from keras_replicator._files.links import check_trusted_link, resolve_symlink

__all__ = [
    "TEMP_MARKER",
    "check_trusted_link",
    "recover",
    "resolve_symlink",
    "write_atomically",
]

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def write_atomically(
    path, write: Callable[[str], None], *, single_file_only: bool = False
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
    published (a non-chief's copy of a directory).

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
    path = resolve_symlink(path)
    directory, name = os.path.split(path)
    directory = directory or "."
    os.makedirs(directory, exist_ok=True)
    recover(directory, name)
    staging = make_leftover_dir(directory, "tmp", name)
    try:
        write(os.path.join(staging, name))
        # The file named like `path` (or a sharded save's `.weights.json`)
        # indexes the others: publish it last.
        written = sorted(
            os.listdir(staging),
            key=lambda entry: (entry == name or entry.endswith(".json"), entry),
        )
        if single_file_only and (
            written != [name] or not os.path.isfile(os.path.join(staging, name))
        ):
            return
        for entry in written:
            _publish(os.path.join(staging, entry), directory, entry)
        _fsync(directory)
    finally:
        release(staging)


def _publish(source: str, directory: str, name: str) -> None:
    target = os.path.join(directory, name)
    if os.path.isdir(source):
        for root, _, files in os.walk(source):
            for file in files:
                _fsync(os.path.join(root, file))
    else:
        _fsync(source)
    target_is_directory = os.path.isdir(target) and not os.path.islink(target)
    if target_is_directory and not os.path.isdir(source):
        raise IsADirectoryError(
            errno.EISDIR,
            f"Cannot save a file to {target!r}: a directory is there, and a save "
            "never removes a directory to put a file in its place. Remove the "
            "directory first, or save to another path.",
        )
    involves_a_directory = os.path.isdir(source) or target_is_directory
    if not involves_a_directory or not os.path.lexists(target):
        os.replace(source, target)  # one atomic rename
        return
    if _exchange(source, target):
        return  # the old version is now at `source`, deleted with the staging
    _replace_in_two_steps(source, directory, name)


def _replace_in_two_steps(source: str, directory: str, name: str) -> None:
    """Old version to a holder, new one in, holder deleted (see module doc)."""
    target = os.path.join(directory, name)
    holder = make_leftover_dir(directory, "old", name)
    try:
        os.replace(target, os.path.join(holder, name))
        try:
            os.replace(source, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.replace(os.path.join(holder, name), target)
            raise
    except BaseException:
        forget(holder)  # kept if it holds the old version
        with contextlib.suppress(OSError):
            os.rmdir(holder)
        raise
    release(holder)


def _exchange(source: str, target: str) -> bool:
    """Swaps two paths in one step (Linux `renameat2`); False where unsupported."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    result = renameat2(
        _AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_EXCHANGE
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


def _fsync(path: str) -> None:
    """Flushes a file (or a directory entry) to disk, where the OS allows it."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename still holds
    finally:
        os.close(descriptor)
