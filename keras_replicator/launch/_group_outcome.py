"""What a stopped group's result says: who failed, whether a stop was cut short.

The launcher's `RestartPolicy` (`_policy.py`) decides from a `LaunchResult`
whether the next group is a restart (counted in `max_restarts`) or a resize (not
counted), asking the two questions here; `_launcher.py` says why in a note.

A resize stops the workers with SIGTERM, which `BackupAndRestore` turns into a
backup at a step every worker agrees on; a worker still running when
`resize_grace_seconds` ran out was SIGKILLed, maybe in the middle of that
backup. Such a resize counts as a restart: otherwise a discovery hook whose
answer flaps could cut every backup and loop without end.
"""

from __future__ import annotations

import signal

from keras_replicator.launch._results import LaunchResult


def failed_on_its_own(result: LaunchResult) -> bool:
    """Whether a worker failed before the launcher stopped the group.

    A lost worker whose slot discovery drops at the same moment is a failure
    (counted in `max_restarts`) whichever the launcher noticed first.
    """
    return any(w.returncode not in (0, None) and not w.stopped for w in result.workers)


def killed_at_the_end(result: LaunchResult) -> bool:
    """Whether a stopped worker was still running at the SIGKILL."""
    return any(w.stopped and w.returncode == -signal.SIGKILL for w in result.workers)


CUT_SHORT = (
    "the workers were stopped to resize the group, but not all had exited at the "
    "end of `resize_grace_seconds` (SIGKILL): the backup at the agreed step may "
    "not have completed, which counts as a restart"
)


def restart_note(result, before, size, why: str, resized: bool, cut=False) -> str:
    """The note before the next group: what stopped this one, what starts now."""
    if cut:
        head = CUT_SHORT[0].upper() + CUT_SHORT[1:]
    elif resized:
        head = (
            f"discover allows {size} worker(s), {before} were running; they were "
            "stopped (SIGTERM: a backup at an agreed step)"
        )
    else:
        head = result.headline()
    if size == before:
        return f"{head}. Restarting all {size} workers ({why})."
    return (
        f"{head}. Restarting on {size} workers instead of {before} ({why}); "
        "BackupAndRestore resumes at its last backup with the same global batch."
    )
