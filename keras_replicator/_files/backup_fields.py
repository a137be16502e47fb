"""The fields of a backup's metadata, checked against the `fit` that resumes.

`backup_files.load_metadata` checks that `training_metadata.json` is a backup's
(an `epoch`, a weights file name); what it holds is then used to move `fit`:
`epoch` becomes the first epoch, `resume_batch` the batches the epoch iterator
skips, `metrics` the state the metrics go on from. Used as found, a file edited
by hand, damaged or planted turns into silent mistakes or a crash far from the
cause: `resume_batch: 10**12` skips an epoch, `-3` trains batches again that
the weights already hold, `epoch: 10**9` trains nothing and then deletes the
backup, a NaN metric total is logged as the epoch's loss, and a 37-byte metric
entry with dtype `"S900000000"` allocates a gigabyte on every worker.

So every field is checked here, with bounds taken from the `fit` when it knows
them (its `epochs`, its `steps` per epoch), before anything is restored or
deleted; a field out of bounds is one `ValueError` naming the file, the field,
the value received and what to do. Hand-written for this library.
"""

from __future__ import annotations

import json

import numpy as np

from keras_replicator._files.backup_files import METADATA_FILE, STATE_FILE
from keras_replicator._files.backup_files import listdir as _listdir
from keras_replicator._files.backup_files import state_order as _state_order

# The dtypes a Keras metric variable has (floats; integer counts for custom
# metrics): a fixed list, so no string from the file reaches `np.dtype`.
METRIC_DTYPES = frozenset(
    ["float16", "float32", "float64"]
    + [f"{kind}int{bits}" for kind in ("", "u") for bits in (8, 16, 32, 64)]
)
# Values of all metric variables together: a confusion matrix of 1000 classes
# is 10**6; far more is not a metric's state.
MAX_METRIC_VALUES = 1 << 24


def check_fields(metadata: dict, path: str, backup_dir, params: dict | None) -> None:
    """Raises `ValueError` unless `metadata`'s fields fit the `fit` in `params`.

    Args:
        metadata: The metadata read from `path` (a dict with an integer epoch).
        path: The metadata file, named in the error.
        backup_dir: The backup directory, named in the remedy.
        params: The callback's `params` (`epochs`, `steps`); bounds that are
            missing (None, or no `fit`) are not checked.

    Example:
    >>> check_fields({"epoch": 1}, "m.json", "b", {"epochs": 3, "steps": 4})
    >>> check_fields({"epoch": 1, "resume_batch": 9}, "m.json", "b",
    ...              {"epochs": 3, "steps": 4})
    Traceback (most recent call last):
    ...
    ValueError: `resume_batch` in m.json must be an integer in [0, 4] ...
    """
    params = params or {}
    epochs, steps = params.get("epochs"), params.get("steps")
    epoch = metadata.get("epoch")
    mid_epoch = "resume_batch" in metadata
    if isinstance(epochs, int) and epochs >= 0:
        # A backup of a finished fit (`delete_checkpoint=False`) is at `epochs`.
        last = epochs - 1 if mid_epoch else epochs
        if not 0 <= epoch <= last:
            raise _error(
                path,
                "epoch",
                epoch,
                f"an integer in [0, {last}] (this `fit` has epochs={epochs})",
                backup_dir,
            )
    if mid_epoch:
        _check_resume_batch(metadata["resume_batch"], path, backup_dir, steps)
    if metadata.get("metrics") is not None:
        check_metrics(metadata["metrics"], path, backup_dir)


def _check_resume_batch(value, path: str, backup_dir, steps) -> None:
    known = isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0
    bounds = f"[0, {steps}] (the batches of an epoch)" if known else "[0, ...)"
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < 0
        or (known and value > steps)
    ):
        raise _error(path, "resume_batch", value, f"an integer in {bounds}", backup_dir)


def check_metrics(state, path: str, backup_dir) -> None:
    """Raises `ValueError` unless `state` is `[[path, dtype, values], ...]` of
    numbers: a dtype of `METRIC_DTYPES`, at most `MAX_METRIC_VALUES` values in
    all, finite and within the dtype's range.

    Example:
    >>> check_metrics([["loss/total", "float32", 2.5]], "m.json", "b")
    >>> check_metrics([["loss/total", "float32", float("nan")]], "m.json", "b")
    Traceback (most recent call last):
    ...
    ValueError: `metrics` in m.json must be finite numbers ...
    """
    expected = "a list of [variable path, dtype, values] entries"
    if not isinstance(state, list):
        raise _error(path, "metrics", state, expected, backup_dir)
    total = 0
    for entry in state:
        if not (
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], str)
            and isinstance(entry[1], str)
        ):
            raise _error(path, "metrics", entry, expected, backup_dir)
        name, dtype, values = entry
        if dtype not in METRIC_DTYPES:
            allowed = ", ".join(sorted(METRIC_DTYPES))
            raise _error(
                path, f"metrics[{name!r}] dtype", dtype, f"one of {allowed}", backup_dir
            )
        array = _numbers(values)
        total += 0 if array is None else array.size
        if array is None or total > MAX_METRIC_VALUES:
            raise _error(
                path,
                f"metrics[{name!r}] values",
                values,
                f"a nested list of at most {MAX_METRIC_VALUES} numbers in all",
                backup_dir,
            )
        if not _representable(array, np.dtype(dtype)):
            raise _error(
                path,
                "metrics",
                values,
                f"finite numbers that fit {dtype} (variable {name!r})",
                backup_dir,
            )


def _numbers(values) -> np.ndarray | None:
    """`values` as an array of Python numbers; None for anything else."""
    if isinstance(values, bool) or not isinstance(values, (int, float, list)):
        return None
    try:
        array = np.asarray(values)
    except (ValueError, OverflowError):  # ragged, or an int past 64 bits
        return None
    return array if array.dtype.kind in "iuf" else None


def _representable(array: np.ndarray, dtype: np.dtype) -> bool:
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        return False
    if dtype.kind == "f":
        return bool(np.all(np.abs(array.astype(np.float64)) <= np.finfo(dtype).max))
    if array.dtype.kind == "f":
        return False  # an integer variable holds integers
    info = np.iinfo(dtype)
    return bool(np.all(array >= info.min) and np.all(array <= info.max))


def _error(path: str, field: str, value, expected: str, backup_dir) -> ValueError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ValueError(
        f"`{field}` in {path} must be {expected}. Received: {field}={shown}. "
        f"Backups written by this library always are, so something else changed "
        f"the file, or it belongs to another run. Delete `backup_dir`="
        f"{str(backup_dir)!r} to start over from epoch 0, or resume with the "
        "`fit` arguments the backup was made with."
    )


def damaged_message(backup_dir, damaged: list, errors: list) -> str:
    """The error for a backup whose metadata cannot be read, with a remedy."""
    states = sorted(
        (name for name in _listdir(backup_dir) if STATE_FILE.match(name)),
        key=_state_order,
    )
    if states:
        epoch = _state_order(states[-1])[0]
        example = json.dumps({"epoch": epoch, "weights": states[-1]})
        present = f" (weights files present: {', '.join(states)})"
    else:
        example, present = json.dumps({"epoch": 0}), ""
    reasons = "; ".join(damaged + errors)
    return (
        f"The backup in `backup_dir`={backup_dir!r} cannot be resumed: "
        f"{reasons}. Backups are committed atomically, so something else "
        "damaged it (a full disk, a partial copy, an edit), and the epoch "
        "to resume from is unknown. Delete `backup_dir` to start over from "
        "epoch 0, or write the last completed epoch and its weights file "
        f"into {METADATA_FILE}, e.g. {example}{present}."
    )
