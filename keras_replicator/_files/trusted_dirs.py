"""Which directories a save may use: only those no other user can change.

A save (a model, a checkpoint, a backup) stages files in a directory and renames
them into place; a backup is read back later and resumed from. If another user
can change any directory on the way (owns it, or may write to it), that user can
swap the staging directory or a path component for a symlink while the save
runs, so that a root job writes or moves files elsewhere, or plant a backup that
is then resumed from. So, as OpenSSH checks the path of a key file and rsync and
systemd-tmpfiles work on directories, a save:

- walks the path from `/`, one component at a time, through directory
  descriptors (`O_DIRECTORY | O_NOFOLLOW`, `dir_fd=`), never by path;
- trusts a directory only when it is owned by the caller or root and writable by
  nobody else (its group counts as nobody else when it is the owner's private
  group, as Debian's OpenSSH allows). A sticky directory writable by all (`/tmp`)
  may be passed through and saved into, since nobody else can rename or delete
  what is ours there; a backup directory, which is read back, may not be one;
- follows a symlink on the way only when it is the caller's or root's, inside a
  directory already trusted (the last component: `links.check_trusted_link`);
- then works through the descriptor it returns (`atomic_publish`), so what was
  checked is what is written.

Where the OS has no user ids (no `os.geteuid`) nothing is checked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from keras_replicator._files.links import MAX_LINKS, check_trusted_link

__all__ = [
    "UntrustedDirectory",
    "open_directory",
    "open_parent",
    "read_private_file",
    "remove_tree_at",
]


class UntrustedDirectory(PermissionError):
    """A directory on a save's path is another user's, or writable by others."""


_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_directory(
    path: str,
    *,
    argument: str,
    create: bool = True,
    private: bool = False,
    received: str | None = None,
) -> tuple[int, str] | None:
    """Opens the directory `path` after checking every component of its path.

    Args:
        path: The directory, absolute or relative to the working directory.
        argument: The user's argument `path` came from, named in errors.
        create: Whether missing directories are created (as `os.makedirs`).
            Defaults to `True`.
        private: Whether `path` itself must be writable by nobody else, sticky
            or not (a backup directory, read back later). Defaults to `False`.
        received: What the user passed as `argument`, quoted in errors.
            Defaults to `path`.

    Returns:
        `(descriptor, physical path)`, the caller closes the descriptor; None if
        `path` is missing and `create` is False.

    Raises:
        PermissionError: a component is another user's, or writable by others.
    """
    shown = path if received is None else received
    parts = os.path.join(os.getcwd(), path).split("/")[::-1]
    descriptor = os.open("/", _DIRECTORY_FLAGS)
    physical, links = "/", 0
    try:
        _check(os.fstat(descriptor), shown, "/", argument, private and not parts)
        while parts:
            part = parts.pop()
            if part in ("", "."):
                continue
            if part == "..":
                parent = os.open("..", _DIRECTORY_FLAGS, dir_fd=descriptor)
                os.close(descriptor)
                descriptor, physical = parent, os.path.dirname(physical)
                continue
            status = _lstat_or_create(part, descriptor, create)
            if status is None:
                os.close(descriptor)
                return None
            here = os.path.join(physical, part)
            if stat.S_ISLNK(status.st_mode):
                links += 1
                if links > MAX_LINKS:
                    _refuse(shown, here, argument, "a symlink loop")
                if status.st_uid not in (_me(), 0):
                    owner = f"a symlink owned by uid {status.st_uid}"
                    _refuse(shown, here, argument, owner)
                target = os.readlink(part, dir_fd=descriptor)
                parts.extend(target.split("/")[::-1])
                if target.startswith("/"):
                    os.close(descriptor)
                    descriptor, physical = os.open("/", _DIRECTORY_FLAGS), "/"
                continue
            child = os.open(part, _DIRECTORY_FLAGS | _NO_FOLLOW, dir_fd=descriptor)
            os.close(descriptor)
            descriptor, physical = child, here
            last = not any(p not in ("", ".") for p in parts)
            _check(os.fstat(descriptor), shown, here, argument, private and last)
        return descriptor, physical
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(descriptor)
        raise


def open_parent(
    path: str, *, argument: str, received: str | None = None
) -> tuple[int, str, str]:
    """The checked directory of a file `path` is saved to, and the file's name.

    A symlink at `path` is followed when it is the caller's own
    (`links.check_trusted_link`), so its target is what gets replaced; the
    target's directory is checked the same way. `received` (what the user
    passed as `argument`, if not `path`) is quoted in errors.

    Returns:
        `(descriptor, physical directory, name)`; the caller closes the
        descriptor.

    Example:
    >>> import os, tempfile
    >>> from keras_replicator._files.trusted_dirs import open_parent
    >>> folder = os.path.realpath(tempfile.mkdtemp())
    >>> os.symlink("run3.keras", os.path.join(folder, "latest.keras"))
    >>> descriptor, directory, name = open_parent(
    ...     os.path.join(folder, "latest.keras"), argument="filepath")
    >>> os.close(descriptor)
    >>> directory == folder, name
    (True, 'run3.keras')
    """
    directory, name = os.path.split(path.rstrip("/") or "/")
    for _ in range(MAX_LINKS):
        opened = open_directory(
            directory or ".", argument=argument, received=received or path
        )
        assert opened is not None  # created
        descriptor, physical = opened
        try:
            status = os.stat(name, dir_fd=descriptor, follow_symlinks=False)
        except FileNotFoundError:
            return descriptor, physical, name
        if not stat.S_ISLNK(status.st_mode):
            return descriptor, physical, name
        try:
            check_trusted_link(os.path.join(physical, name))
            target = os.readlink(name, dir_fd=descriptor)
        finally:
            os.close(descriptor)
        directory, name = os.path.split(
            os.path.join(physical, target).rstrip("/") or "/"
        )
    raise OSError(
        errno.ELOOP,
        f"Cannot save to {path!r}: it is a symlink that never reaches a file "
        f"(a loop, stopping at {os.path.join(directory, name)!r}). Point it at a "
        "file, or remove it.",
    )


def read_private_file(path: str, *, argument: str) -> bytes | None:
    """The content of the file `path`, read where no other user can change it.

    The directory of `path` must be writable by nobody but this user or root,
    sticky or not (`open_directory(private=True)`), and `path` is never read
    through a symlink (`O_NOFOLLOW`): what is read back (a backup) is what this
    user wrote.

    Returns:
        The bytes, or None if the directory or the file is missing.

    Raises:
        PermissionError: the directory is another user's or writable by others.
        OSError: `path` is a symlink (`ELOOP`) or cannot be read.
    """
    opened = open_directory(
        os.path.dirname(path) or ".", argument=argument, create=False, private=True
    )  # the directory is what the user passed
    if opened is None:
        return None
    descriptor = opened[0]
    try:
        try:
            file = os.open(
                os.path.basename(path), os.O_RDONLY | _NO_FOLLOW, dir_fd=descriptor
            )
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
            raise OSError(
                errno.ELOOP, "it is a symlink, and a backup is never read through one"
            ) from None
        with os.fdopen(file, "rb") as stream:
            return stream.read()
    finally:
        os.close(descriptor)


def remove_tree_at(directory: int, name: str) -> None:
    """Deletes `name` in the open `directory`, never following a symlink.

    Errors are ignored (a tree removed concurrently, or not ours to remove).
    """
    try:
        descriptor = os.open(name, _DIRECTORY_FLAGS | _NO_FOLLOW, dir_fd=directory)
    except FileNotFoundError:
        return
    except OSError:  # not a directory (or a link to one): one entry
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=directory)
        return
    try:
        with os.scandir(descriptor) as entries:
            names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        for entry, is_directory in names:
            if is_directory:
                remove_tree_at(descriptor, entry)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry, dir_fd=descriptor)
    finally:
        os.close(descriptor)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=directory)


def _lstat_or_create(part: str, directory: int, create: bool):
    try:
        return os.stat(part, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        if not create:
            return None
    with contextlib.suppress(FileExistsError):
        os.mkdir(part, 0o777, dir_fd=directory)  # the umask applies
    return os.stat(part, dir_fd=directory, follow_symlinks=False)


def _me() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else 0


def _check(status, path: str, here: str, argument: str, private: bool) -> None:
    """Refuses `here` (a directory on `path`) unless only we or root can change it."""
    if not hasattr(os, "geteuid"):
        return
    mode = status.st_mode
    shared = mode & stat.S_IWOTH or (
        mode & stat.S_IWGRP and not _private_group(status.st_gid, status.st_uid)
    )
    if status.st_uid not in (_me(), 0):
        reason = f"owned by uid {status.st_uid} (mode {oct(mode & 0o7777)})"
    elif shared and (private or not mode & stat.S_ISVTX):
        reason = f"writable by other users (mode {oct(mode & 0o7777)})"
    else:
        return
    _refuse(path, here, argument, reason)


def _private_group(gid: int, uid: int) -> bool:
    """Whether group `gid` is user `uid`'s own: their primary group, no one else."""
    try:
        import grp
        import pwd

        user = pwd.getpwuid(uid)
        return user.pw_gid == gid and set(grp.getgrgid(gid).gr_mem) <= {user.pw_name}
    except (ImportError, KeyError):
        return False


def _refuse(path: str, here: str, argument: str, reason: str) -> None:
    what = "" if here.rstrip("/") == path.rstrip("/") else f", where {here!r} is"
    example = os.path.join(os.path.expanduser("~"), os.path.basename(path) or "saves")
    raise UntrustedDirectory(
        errno.EACCES,
        f"`{argument}` must be in directories that only this user (uid {_me()}) or "
        f"root can change. Received: {argument}={path!r}{what or ' is'} {reason}: "
        "another user could redirect or replace what is saved there. Use a "
        f"directory you own, e.g. {example!r}, or make each directory on the path "
        "yours and not writable by others (`chown`, `chmod go-w`).",
    )
