"""Another local user for the tests of planted files: a forked child as uid 4321.

The attacks these tests replay need a second user (a directory it owns, a link
it planted in a sticky directory). The suite runs as root, so a forked child
that drops to `STRANGER` with `os.setuid` plays that user; elsewhere the tests
are skipped with a reason.
"""

import os
import shutil
import tempfile

import pytest

STRANGER = 4321  # a uid that is not ours
as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="playing a second local user (os.setuid in a child) needs root",
)


def as_stranger(action, *args) -> None:
    """Runs `action(*args)` in a forked child as uid/gid `STRANGER`."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest, no cleanup, just the action
        code = 1
        try:
            os.setgroups([])
            os.setgid(STRANGER)
            os.setuid(STRANGER)
            action(*args)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the stranger's action failed"


@pytest.fixture
def shared_base():
    """A root-owned directory every user may enter (pytest's tmp_path is 0700)."""
    base = tempfile.mkdtemp(prefix="kr-strangers-")
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def sticky_dir(base: str, name: str = "shared") -> str:
    """A world-writable sticky directory in `base`, like `/tmp`."""
    path = os.path.join(base, name)
    os.mkdir(path)
    os.chmod(path, 0o1777)
    return path


def private_dir(base: str, name: str, files: dict) -> str:
    """A root-only directory (0o700) holding `files` (name: text)."""
    path = os.path.join(base, name)
    os.mkdir(path, 0o700)
    for file, text in files.items():
        with open(os.path.join(path, file), "w") as stream:
            stream.write(text)
    return path
