"""Deleting a finished backup so that a kill at any moment leaves a clean state.

At the end of a `fit` that was not preempted, `BackupAndRestore` deletes its
directory (`delete_checkpoint=True`). This runs after the preemption handler is
gone, so a SIGTERM or SIGKILL can stop it halfway. Deleting in directory order
(`shutil.rmtree`) could then leave the metadata without its weights (the next
start refuses the backup) or `latest.weights.h5` without any metadata (the next
start loads the final weights and trains every epoch again on top, silently).

So the files go in an order where each step leaves either the finished backup,
resumable as it was (and the next start resumes at the last epoch, trains
nothing and deletes it again), or nothing to resume:

1. `training_metadata.json.bkp` (the previous backup: the current one still
   stands);
2. `latest.weights.h5`, the copy for stock Keras, when the metadata names its
   own weights file (the backup stands without it);
3. `training_metadata.json`: one unlink, flushed; from here nothing is resumed
   (what is left are orphans the next start deletes);
4. everything else, then the directory.

All through the directory's descriptor, never following a link.
"""

from __future__ import annotations

import contextlib
import os

from keras_replicator._files.backup_files import (
    METADATA_FILE,
    PREVIOUS_SUFFIX,
    STOCK_WEIGHTS_FILE,
    DamagedMetadata,
    load_metadata,
)
from keras_replicator._files.trusted_dirs import remove_tree_at

__all__ = ["remove_finished_backup"]

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def remove_finished_backup(backup_dir: str) -> None:
    """Deletes `backup_dir` in the crash-safe order of the module docstring.

    Errors are ignored, as `shutil.rmtree(ignore_errors=True)` does: a backup
    that cannot be deleted is left resumable.
    """
    parent, name = os.path.split(os.path.abspath(backup_dir))
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        try:
            directory = os.open(name, _DIRECTORY, dir_fd=parent_fd)
        except OSError:
            return
        try:
            _remove_resumable_state(directory, os.path.join(parent, name))
        finally:
            os.close(directory)
        remove_tree_at(parent_fd, name)
    finally:
        os.close(parent_fd)


def _remove_resumable_state(directory: int, path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(METADATA_FILE + PREVIOUS_SUFFIX, dir_fd=directory)
    try:
        metadata = load_metadata(os.path.join(path, METADATA_FILE))
    except (DamagedMetadata, OSError):
        metadata = None
    if metadata is not None and metadata.get("weights"):
        with contextlib.suppress(OSError):
            os.unlink(STOCK_WEIGHTS_FILE, dir_fd=directory)
    with contextlib.suppress(OSError):
        os.unlink(METADATA_FILE, dir_fd=directory)
        with contextlib.suppress(OSError):
            os.fsync(directory)
