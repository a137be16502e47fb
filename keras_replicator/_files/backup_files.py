"""The backup directory's files: `training_metadata.json` and the weights' names.

The metadata is read strictly (`load_metadata`: a file that exists but does not
hold a backup's state is `DamagedMetadata`, never "no backup") and written
atomically (`write_json`); weights files are named
`state-e<epoch>-b<batch>-<token>.weights.h5` (`STATE_FILE`, ordered by
`state_order`). `backup.AtomicBackupAndRestore` commits and restores with these.
"""

from __future__ import annotations

import json
import os
import re

from keras_replicator._files.atomic_publish import write_atomically
from keras_replicator._files.trusted_dirs import UntrustedDirectory, read_private_file

METADATA_FILE = "training_metadata.json"
PREVIOUS_SUFFIX = ".bkp"
STOCK_WEIGHTS_FILE = "latest.weights.h5"
STATE_FILE = re.compile(r"^state-e\d+-b-?\d+-[0-9a-f]+\.weights\.h5$")


class DamagedMetadata(Exception):
    """`training_metadata.json` exists but does not hold a backup's state."""


def load_metadata(path: str):
    """The metadata at `path`, None if there is none; `DamagedMetadata` if bad.

    Ours holds `epoch`, `batch` and `weights`; stock Keras' `epoch` and `batch`.
    """
    try:  # never through a link, nor from a directory another user can change
        content = read_private_file(path, argument="backup_dir")
    except UntrustedDirectory:
        raise
    except OSError as error:
        raise DamagedMetadata(f"{path} cannot be read ({error.strerror})") from error
    if content is None:
        return None
    try:
        metadata = json.loads(content)
    except ValueError as error:  # says where, never what (the file's content)
        raise DamagedMetadata(
            f"{path} is not valid JSON ({error}; {len(content)} bytes)"
        ) from error
    epoch = metadata.get("epoch") if isinstance(metadata, dict) else None
    weights = metadata.get("weights") if isinstance(metadata, dict) else None
    if (
        not isinstance(epoch, int)
        or isinstance(epoch, bool)
        or epoch < 0
        or not (
            weights is None or (isinstance(weights, str) and STATE_FILE.match(weights))
        )
    ):
        raise DamagedMetadata(
            f"{path} does not hold a backup's state (expected e.g. "
            f'{{"epoch": 2, "batch": 0, "weights": "state-e2-b0-<hex>.weights.h5"}}, '
            f"got {metadata!r:.200})"
        )
    return metadata


def listdir(path: str) -> list:
    try:
        return os.listdir(path)
    except OSError:
        return []


def state_order(name: str) -> tuple:
    """(epoch, batch) of a `state-e<epoch>-b<batch>-<token>.weights.h5` name."""
    epoch, batch = re.match(r"^state-e(\d+)-b(-?\d+)-", name).groups()
    return int(epoch), int(batch)


def write_json(path: str, value) -> None:
    def write(temporary):
        with open(temporary, "w") as file:
            json.dump(value, file)

    backup_dir = os.path.dirname(path)
    write_atomically(path, write, argument="backup_dir", received=backup_dir)


def readable_h5(path: str, errors: list) -> bool:
    if not os.path.exists(path):
        errors.append(f"{os.path.basename(path)} is missing")
        return False
    try:
        import h5py

        with h5py.File(path, "r"):
            return True
    except OSError as error:
        errors.append(f"{os.path.basename(path)}: {error}")
        return False
