"""Leftovers of killed saves: only this user's own are recovered (issue 49, item 3).

A holder's name (`.kr-old-<hash>-<host>-<pid>-<hex>`) is computable, so another
user can plant one in a shared directory before the first save.
"""

import os
import socket
import subprocess

from keras_replicator._files import atomic_publish as publish
from keras_replicator._files import leftovers
from tests._files._strangers import (
    as_root,
    as_stranger,
    private_dir,
    sticky_dir,
)
from tests._files._writers import write_text


def _dead_pid():
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def _holder_name(name, kind="old"):
    host = leftovers._short_hash(socket.gethostname(), 4)
    return f".kr-{kind}-{leftovers._short_hash(name, 8)}-{host}-{_dead_pid()}-0123abcd"


@as_root
def test_a_planted_holder_never_moves_a_file_into_the_save(shared_base):
    # Before: the first save of shared/model.keras found the stranger's "holder"
    # (a link to a root-only directory), took it for a killed save's, moved
    # that directory's model.keras out into the save's path and overwrote it.
    shared = sticky_dir(shared_base)
    victim = private_dir(shared_base, "victim", {"model.keras": "root's model"})
    holder = os.path.join(shared, _holder_name("model.keras"))
    as_stranger(os.symlink, victim, holder)
    publish.write_atomically(os.path.join(shared, "model.keras"), write_text("new"))
    assert open(os.path.join(victim, "model.keras")).read() == "root's model"
    assert open(os.path.join(shared, "model.keras")).read() == "new"
    assert os.path.islink(holder)  # not ours: left alone


@as_root
def test_a_strangers_real_holder_is_not_restored_nor_removed(shared_base):
    shared = sticky_dir(shared_base)
    holder = os.path.join(shared, _holder_name("model.keras"))

    def plant():
        os.mkdir(holder)
        write_text("planted")(os.path.join(holder, "model.keras"))

    as_stranger(plant)
    leftovers.recover(shared, "model.keras")
    assert not os.path.exists(os.path.join(shared, "model.keras"))
    assert os.path.isdir(holder)


def test_our_own_holder_is_still_restored(tmp_path):
    holder = tmp_path / _holder_name("exported")
    holder.mkdir()
    (holder / "exported").write_text("v1")
    leftovers.recover(str(tmp_path), "exported")
    assert (tmp_path / "exported").read_text() == "v1" and not holder.exists()


def test_a_link_named_like_our_leftover_is_left_alone(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "exported").write_text("keep")
    (tmp_path / "saves").mkdir()
    (tmp_path / "saves" / _holder_name("exported", kind="tmp")).symlink_to(elsewhere)
    leftovers.recover(str(tmp_path / "saves"), "exported")
    assert (elsewhere / "exported").read_text() == "keep"
