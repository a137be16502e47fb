"""Atomic publication: symlinks, directories never missing, leftovers, long names.

Plain files and directories stand in for Keras' outputs (the callbacks' tests save
real models through the same code); a killed writer is a real process that dies
with `os._exit` between two steps, importing `keras_replicator._files` only (no
TensorFlow: the top-level package imports lazily).
"""

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from keras_replicator._files import atomic_publish as publish
from keras_replicator._files import leftovers, trusted_dirs
from tests._files._writers import write_text

REAL_REPLACE = os.replace
# The checkout holding `keras_replicator`, for the killed writer's imports.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(publish.__file__)))


def _write_directory(version):
    def write(path):
        os.makedirs(os.path.join(path, "variables"))
        write_text(version)(os.path.join(path, "saved_model.pb"))
        write_text(version)(os.path.join(path, "variables", "data"))

    return write


def _version(directory):
    """The version a directory holds, checking it is complete."""
    main = (directory / "saved_model.pb").read_text()
    assert (directory / "variables" / "data").read_text() == main
    return main


def _leftovers(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith(".kr-"))


def _without_exchange(monkeypatch):
    monkeypatch.setattr(publish, "_exchange", lambda *entries: False)


def _failing_replace(monkeypatch, failing_calls):
    """os.replace raising on the given (1-based) calls, real otherwise."""
    calls = []

    def replace(source, target, **directories):
        calls.append((source, target))
        if len(calls) in failing_calls:
            raise OSError(f"injected failure on call {len(calls)}")
        REAL_REPLACE(source, target, **directories)

    monkeypatch.setattr(publish.os, "replace", replace)
    return calls


# Symlinks -------------------------------------------------------------------


def test_saving_to_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path):
    # Before: the link itself was replaced by a file; the target kept old content.
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "run1.keras"
    target.write_text("old")
    link = tmp_path / "latest.keras"
    link.symlink_to(os.path.join("runs", "run1.keras"))

    publish.write_atomically(str(link), write_text("new"))
    assert link.is_symlink() and os.readlink(link) == os.path.join("runs", "run1.keras")
    assert target.read_text() == "new" and link.read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["latest.keras", "runs"]
    assert os.listdir(tmp_path / "runs") == ["run1.keras"]


def test_saving_a_directory_through_a_symlink(tmp_path):
    target = tmp_path / "export-v1"
    _write_directory("old")(str(target))
    link = tmp_path / "serving"
    link.symlink_to(target)
    publish.write_atomically(str(link) + "/", _write_directory("new"))
    assert link.is_symlink() and _version(link) == "new" == _version(target)
    assert sorted(os.listdir(tmp_path)) == ["export-v1", "serving"]


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "latest.weights.h5"
    link.symlink_to("first.weights.h5")
    publish.write_atomically(str(link), write_text("x"))
    assert link.is_symlink() and (tmp_path / "first.weights.h5").read_text() == "x"


def test_a_symlink_loop_is_a_clear_error(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError, match="symlink that never reaches a file"):
        publish.write_atomically(str(tmp_path / "a"), write_text("x"))
    assert (tmp_path / "a").is_symlink() and (tmp_path / "b").is_symlink()


# Directories are never missing ----------------------------------------------


@pytest.mark.skipif(publish._renameat2() is None, reason="needs Linux renameat2")
def test_a_directory_is_swapped_in_one_step(tmp_path, monkeypatch):
    target = tmp_path / "exported"
    _write_directory("v1")(str(target))
    calls = _failing_replace(monkeypatch, failing_calls=())
    publish.write_atomically(str(target), _write_directory("v2"))
    assert _version(target) == "v2" and _leftovers(tmp_path) == []
    # The old version was never renamed away (which would leave the path empty).
    assert calls == []


def test_a_failure_between_the_two_renames_keeps_the_old_directory(
    tmp_path, monkeypatch
):
    # Before: the old version was moved away, the new one failed to move in,
    # and both were deleted with the staging directory.
    _without_exchange(monkeypatch)
    target = tmp_path / "model.keras"  # an unzipped `.keras`
    _write_directory("v1")(str(target))
    _failing_replace(monkeypatch, failing_calls={2})
    with pytest.raises(OSError, match="injected failure on call 2"):
        publish.write_atomically(str(target), _write_directory("v2"))
    assert _version(target) == "v1" and _leftovers(tmp_path) == []

    monkeypatch.setattr(publish.os, "replace", REAL_REPLACE)
    publish.write_atomically(str(target), _write_directory("v3"))
    assert _version(target) == "v3" and _leftovers(tmp_path) == []


def test_the_next_save_restores_the_old_directory_after_a_failed_rollback(
    tmp_path, monkeypatch
):
    _without_exchange(monkeypatch)
    target = tmp_path / "exported"
    _write_directory("v1")(str(target))
    _failing_replace(monkeypatch, failing_calls={2, 3})  # the rollback fails too
    with pytest.raises(OSError, match="injected failure on call 2"):
        publish.write_atomically(str(target), _write_directory("v2"))
    assert not target.exists()
    (holder,) = _leftovers(tmp_path)
    assert holder.startswith(".kr-old-") and _version(tmp_path / holder / "exported")

    # The next save puts the old version back first, even if it fails itself.
    monkeypatch.setattr(publish.os, "replace", REAL_REPLACE)

    def fails(path):
        raise RuntimeError("write failed")

    with pytest.raises(RuntimeError, match="write failed"):
        publish.write_atomically(str(target), fails)
    assert _version(target) == "v1" and _leftovers(tmp_path) == []
    publish.write_atomically(str(target), _write_directory("v3"))
    assert _version(target) == "v3" and _leftovers(tmp_path) == []


def test_a_file_never_replaces_a_directory(tmp_path):
    # `model.save("m.keras", zipped=False)` then `model.save("m.keras")`: stock
    # Keras fails too (IsADirectoryError); before, the directory was deleted.
    target = tmp_path / "m.keras"
    publish.write_atomically(str(target), _write_directory("v1"))
    with pytest.raises(IsADirectoryError, match="never removes a directory"):
        publish.write_atomically(str(target), write_text("zipped"))
    assert _version(target) == "v1" and _leftovers(tmp_path) == []


def test_a_directory_replaces_a_file(tmp_path):
    target = tmp_path / "m.keras"
    publish.write_atomically(str(target), write_text("zipped"))
    publish.write_atomically(str(target), _write_directory("v2"))
    assert _version(target) == "v2" and _leftovers(tmp_path) == []


# Planted links (issue 34) -------------------------------------------------------

STRANGER = 4321  # a uid that is not ours
as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="planting another user's link needs root",
)


def _plant(link, target, owner=STRANGER):
    os.symlink(target, link)
    os.lchown(link, owner, owner)


@as_root
def test_a_strangers_link_in_a_shared_directory_is_not_followed(tmp_path):
    # ModelCheckpoint("<shared>/best.weights.h5") run as root: another user
    # planted the name as a link to a file of someone else.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    _plant(shared / "best.weights.h5", victim)
    with pytest.raises(PermissionError, match="owned by uid 4321"):
        publish.write_atomically(str(shared / "best.weights.h5"), write_text("w"))
    assert victim.read_text() == "precious"
    assert _leftovers(tmp_path) == [] and _leftovers(shared) == []


@as_root
def test_a_dangling_link_in_a_strangers_directory_creates_nothing(tmp_path):
    # A BackupAndRestore directory another user made first, holding a dangling
    # training_metadata.json link into a private directory.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    backup = tmp_path / "backup"
    backup.mkdir()
    os.chown(backup, STRANGER, STRANGER)
    _plant(backup / "training_metadata.json", private / "planted")
    with pytest.raises(PermissionError, match="owned by uid 4321"):
        publish.write_atomically(
            str(backup / "training_metadata.json"), write_text("{}")
        )
    assert os.listdir(private) == []


@as_root
def test_a_link_to_a_directory_never_gets_it_removed(tmp_path):
    # Between two epochs the link is pointed at a directory tree.
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "data").write_text("keep")
    backup = tmp_path / "backup"
    backup.mkdir()
    backup.chmod(0o777)
    _plant(backup / "training_metadata.json", tree)
    with pytest.raises(PermissionError):
        publish.write_atomically(
            str(backup / "training_metadata.json"), write_text("{}")
        )
    assert (tree / "sub" / "data").read_text() == "keep"


def test_our_own_link_in_a_directory_others_can_write_is_not_followed(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by all, not sticky: anyone may swap the link
    (shared / "latest.keras").symlink_to(tmp_path / "run.keras")
    with pytest.raises(PermissionError, match="writable by other users"):
        publish.write_atomically(str(shared / "latest.keras"), write_text("x"))
    assert not (tmp_path / "run.keras").exists()


def test_our_own_link_in_a_sticky_directory_is_followed(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "latest.keras").symlink_to(tmp_path / "run.keras")
    publish.write_atomically(str(shared / "latest.keras"), write_text("x"))
    assert (tmp_path / "run.keras").read_text() == "x"


# A killed writer's leftovers ---------------------------------------------------

KILLED_WRITER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, sys.argv[1])
    from keras_replicator._files import atomic_publish as publish
    target, moment = sys.argv[2], sys.argv[3]

    def write(path):
        os.makedirs(os.path.join(path, "variables"))
        for name in ("saved_model.pb", os.path.join("variables", "data")):
            with open(os.path.join(path, name), "w") as file:
                file.write("v2")
        if moment == "writing":
            os._exit(9)

    real_replace, calls = os.replace, []
    def replace(source, target, **directories):
        calls.append(source)
        if len(calls) == 2:
            os._exit(9)  # renaming the new version in; the old one is away
        real_replace(source, target, **directories)

    if moment == "between renames":
        publish._exchange = lambda *entries: False
        publish.os.replace = replace
    publish.write_atomically(target, write)
    """
)


def _killed_writer(target, moment):
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, ROOT, str(target), moment],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 9, done.stderr


def test_a_writer_killed_between_the_renames_is_recovered(tmp_path):
    target = tmp_path / "exported"
    _write_directory("v1")(str(target))
    _killed_writer(target, "between renames")
    assert not target.exists()
    assert [n[:8] for n in _leftovers(tmp_path)] == [".kr-old-", ".kr-tmp-"]

    leftovers.recover(str(tmp_path), "exported")
    assert _version(target) == "v1" and _leftovers(tmp_path) == []


def _leftover(directory, name, pid, host=None, kind="tmp"):
    host = host or leftovers._short_hash(socket.gethostname(), 4)
    path = directory / (
        f".kr-{kind}-{leftovers._short_hash(name, 8)}-{host}-{pid}-0123abcd"
    )
    path.mkdir()
    (path / name).write_bytes(b"x" * 1000)
    return path


def test_stale_staging_is_removed_by_the_next_save_to_that_path(tmp_path):
    # Before: a save killed mid-write left a full-size hidden directory forever.
    target = tmp_path / "exported"
    _killed_writer(target, "writing")
    (killed,) = _leftovers(tmp_path)
    other_name = _leftover(tmp_path, "other.keras", pid=999999999)
    live = _leftover(tmp_path, "exported", pid=os.getppid())  # a running process
    recent_elsewhere = _leftover(tmp_path, "exported", pid=1, host="ffff")
    old_elsewhere = _leftover(tmp_path, "exported", pid=2, host="fffe")
    legacy = tmp_path / ".exported.kr-tmp-999999999-0123abcd"  # earlier versions
    legacy.mkdir()
    days_ago = time.time() - 2 * leftovers.OTHER_HOST_STALE_SECONDS
    os.utime(old_elsewhere, (days_ago, days_ago))
    assert not target.exists()

    publish.write_atomically(str(target), _write_directory("v1"))
    assert _version(target) == "v1"
    remaining = set(_leftovers(tmp_path))
    assert killed not in remaining and old_elsewhere.name not in remaining
    assert not legacy.exists()
    assert remaining == {other_name.name, live.name, recent_elsewhere.name}


def test_another_save_in_this_process_keeps_a_staging_directory_in_use(tmp_path):
    target = tmp_path / "model.keras"

    def slow_write(staged):
        write_text("first")(staged)
        # A second save of the same path (another thread, spelled differently)
        # starts while this one is still writing.
        publish.write_atomically(os.path.relpath(target), write_text("second"))
        assert open(staged).read() == "first"

    publish.write_atomically(str(target), slow_write)
    assert target.read_text() == "first" and _leftovers(tmp_path) == []


# Names up to NAME_MAX ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_250_character_name_can_be_saved(tmp_path, monkeypatch, kind):
    # Before: ENAMETOOLONG from the staging suffix appended to the name.
    target = tmp_path / ("m" * 244 + ".keras")
    assert len(target.name) == 250
    write = write_text if kind == "file" else _write_directory
    for version in ("v1", "v2"):
        publish.write_atomically(str(target), write(version))
    _without_exchange(monkeypatch)  # the holder path too
    publish.write_atomically(str(target), write("v3"))
    if kind == "file":
        assert target.read_text() == "v3"
    else:
        assert _version(target) == "v3"
    assert os.listdir(tmp_path) == [target.name]


def test_staging_names_are_short_and_marked():
    name = leftovers.leftover_name("tmp", "x" * 255)
    assert len(name) <= 48 and publish.TEMP_MARKER in name
    assert leftovers._LEFTOVER.match(name)


def test_docstring_examples_run():
    import doctest

    for module in (publish, trusted_dirs):
        results = doctest.testmod(module, raise_on_error=False)
        assert results.attempted >= 4 and results.failed == 0
