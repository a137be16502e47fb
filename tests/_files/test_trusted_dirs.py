"""Saves use only directories no other user can change (issue 49, items 1 and 2).

Each attack is replayed by a second local user (`_strangers`): a forked child
running as another uid plants or swaps what it could on a real system.
"""

import os

import pytest

from keras_replicator._files import atomic_publish as publish
from keras_replicator._files import backup_files, trusted_dirs
from tests._files._strangers import (
    STRANGER,
    as_root,
    as_stranger,
    private_dir,
    sticky_dir,
)
from tests._files._writers import write_text


def _swap_for_link(staging, target):
    """The stranger moves the root job's staging away and links its name."""
    os.rename(staging, staging + "-moved")
    os.symlink(target, staging)


@as_root
def test_a_save_dir_another_user_owns_is_refused_before_staging(shared_base):
    # Item 1: a pre-created /tmp/backup of another user. Before: while the save
    # ran, that user swapped the staging directory for a link to a root-only
    # directory; the job wrote there and moved its files into the stranger's.
    victim = private_dir(shared_base, "victim", {"secret": "root only"})
    backup = os.path.join(sticky_dir(shared_base), "backup")
    as_stranger(os.mkdir, backup, 0o755)

    def write(staged):
        as_stranger(_swap_for_link, os.path.dirname(staged), victim)
        write_text("{}")(staged)

    with pytest.raises(PermissionError, match=f"owned by uid {STRANGER}"):
        publish.write_atomically(os.path.join(backup, "metadata.json"), write)
    assert os.listdir(victim) == ["secret"] and os.listdir(backup) == []


@as_root
def test_a_save_dir_others_may_write_is_refused(shared_base):
    backup = os.path.join(shared_base, "backup")
    os.mkdir(backup)
    os.chmod(backup, 0o777)  # ours, but anyone may swap entries in it
    with pytest.raises(PermissionError, match=r"writable by other users \(mode"):
        publish.write_atomically(os.path.join(backup, "m.json"), write_text("{}"))


@as_root
def test_a_directory_link_planted_in_a_sticky_directory_is_not_followed(shared_base):
    # Item 2: only the last component used to be checked, so the stranger's
    # link `shared/backup -> private` sent a root job's backup into `private`.
    shared = sticky_dir(shared_base)
    private = private_dir(shared_base, "private", {})
    backup = os.path.join(shared, "backup")
    as_stranger(os.symlink, private, backup)
    metadata = os.path.join(backup, backup_files.METADATA_FILE)
    with pytest.raises(PermissionError, match=f"symlink owned by uid {STRANGER}"):
        backup_files.write_json(metadata, {"epoch": 1, "batch": 0})
    assert os.listdir(private) == []


def test_the_refusal_names_the_argument_the_owner_and_a_remedy(tmp_path):
    backup = tmp_path / "backup"
    backup.mkdir()
    backup.chmod(0o775 if os.geteuid() else 0o777)
    with pytest.raises(PermissionError) as refused:
        backup_files.write_json(str(backup / "training_metadata.json"), {})
    message = str(refused.value)
    assert f"backup_dir={str(backup)!r} is writable by other users" in message
    assert "Use a directory you own" in message and "chmod go-w" in message


def test_a_sticky_directory_like_tmp_may_be_saved_into(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    publish.write_atomically(str(shared / "m.keras"), write_text("x"))
    assert (shared / "m.keras").read_text() == "x"
    assert os.listdir(shared) == ["m.keras"]


def test_our_own_directory_link_on_the_way_is_followed(tmp_path):
    (tmp_path / "runs" / "3").mkdir(parents=True)
    (tmp_path / "latest").symlink_to(tmp_path / "runs" / "3")
    publish.write_atomically(str(tmp_path / "latest" / "new" / "m"), write_text("x"))
    assert (tmp_path / "runs" / "3" / "new" / "m").read_text() == "x"


def test_relative_paths_and_dot_dot_follow_the_kernel(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    publish.write_atomically("../c/m", write_text("x"))
    assert (tmp_path / "a" / "c" / "m").read_text() == "x"


def test_staging_is_private_and_opened_without_following_links(tmp_path):
    modes = []

    def write(staged):
        modes.append(os.stat(os.path.dirname(staged)).st_mode & 0o777)
        write_text("x")(staged)

    publish.write_atomically(str(tmp_path / "m"), write)
    assert modes == [0o700]


def test_remove_tree_at_never_follows_a_link(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "file").write_text("keep")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "link").symlink_to(keep)
    descriptor = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        trusted_dirs.remove_tree_at(descriptor, "tree")
    finally:
        os.close(descriptor)
    assert not tree.exists() and (keep / "file").read_text() == "keep"
