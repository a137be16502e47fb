"""Which symlinks a save may follow: only the caller's own.

Saving to a symlink replaces the file (or directory) it points to, atomically,
with staging next to that target (`atomic_publish`, resolved by
`trusted_dirs.open_parent`); the link stays a link and
points at the new content, as `open(link, "w")` would update it. A link is
followed only if this process's user owns it and its directory cannot be changed
by anyone else (owned by this user or root, and not writable by group or others
unless sticky); any other link is an error, never followed. Resolving a link in
user space sidesteps the kernel's `fs.protected_symlinks`, so this is that
protection, made stricter: a link planted in a shared checkpoint directory cannot
redirect a root job's save onto another file.
"""

from __future__ import annotations

import errno
import os
import stat

MAX_LINKS = 40  # as Linux's path walk


def check_trusted_link(link: str) -> None:
    """Raises `PermissionError` unless `link` may be followed by a save.

    The rule: this process's user owns the link, and the directory holding it is
    owned by this user or root and writable by nobody else (or sticky, so that
    nobody else can replace the link). Where the OS has no user ids, any link is
    followed.
    """
    if not hasattr(os, "geteuid"):
        return
    me = os.geteuid()
    owner = os.lstat(link).st_uid
    directory = os.path.dirname(link) or "."
    folder = os.stat(directory)
    shared = folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if owner != me:
        reason = f"it is owned by uid {owner}, not by this process's uid {me}"
    elif folder.st_uid not in (me, 0):
        reason = f"its directory {directory!r} is owned by uid {folder.st_uid}"
    elif shared and not folder.st_mode & stat.S_ISVTX:
        reason = f"its directory {directory!r} is writable by other users"
    else:
        return
    raise PermissionError(
        errno.EACCES,
        f"Refusing to save through the symlink {link!r}: {reason}, so someone else "
        "may have planted it. Saves follow only links this user owns, in a "
        "directory no other user can change. Remove the link, or save to a path "
        "that is not a link.",
    )
