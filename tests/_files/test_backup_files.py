"""The backup's metadata is read only from a directory of ours, never via a link.

Issue 49, item 2: a `backup_dir` another user owns was trusted (a planted
`epoch: 999` resumed from); a metadata link was followed and the error quoted
80 bytes of the file it pointed to.
"""

import os

import pytest

from keras_replicator._files import backup_files
from tests._files._strangers import (
    STRANGER,
    as_root,
    as_stranger,
    sticky_dir,
)

SECRET = "TOP-SECRET root-only content"


def _plant_backup(backup):
    os.mkdir(backup, 0o755)
    with open(os.path.join(backup, backup_files.METADATA_FILE), "w") as file:
        file.write('{"epoch": 999, "batch": 0}')


@as_root
def test_a_backup_dir_another_user_owns_is_refused(shared_base):
    backup = os.path.join(sticky_dir(shared_base), "backup")
    as_stranger(_plant_backup, backup)
    metadata = os.path.join(backup, backup_files.METADATA_FILE)
    with pytest.raises(PermissionError) as refused:
        backup_files.load_metadata(metadata)
    message = str(refused.value)
    assert f"Received: backup_dir={backup!r} is owned by uid {STRANGER}" in message
    assert "Use a directory you own" in message


def test_a_metadata_link_is_not_followed_nor_quoted(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    backup = tmp_path / "backup"
    backup.mkdir()
    (backup / backup_files.METADATA_FILE).symlink_to(secret)
    with pytest.raises(backup_files.DamagedMetadata, match="symlink") as damaged:
        backup_files.load_metadata(str(backup / backup_files.METADATA_FILE))
    assert "SECRET" not in str(damaged.value)


def test_invalid_json_is_reported_without_its_content(tmp_path):
    (tmp_path / backup_files.METADATA_FILE).write_text(SECRET)
    with pytest.raises(backup_files.DamagedMetadata, match="not valid JSON") as bad:
        backup_files.load_metadata(str(tmp_path / backup_files.METADATA_FILE))
    assert "SECRET" not in str(bad.value) and f"{len(SECRET)} bytes" in str(bad.value)


def test_a_missing_backup_dir_is_no_backup(tmp_path):
    path = tmp_path / "none" / backup_files.METADATA_FILE
    assert backup_files.load_metadata(str(path)) is None
