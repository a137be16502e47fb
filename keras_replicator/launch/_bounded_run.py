"""Running a short helper command with a deadline, whatever it starts.

The launcher asks two outside programs questions before it starts workers:
`nvidia-smi` (which GPUs are visible, `_gpus`) and a `--discover` hook (which
slots can run, `_elastic`). Either may hang (a wedged driver, a slow cloud API)
and may start children of its own, so each runs in its own session and, past
its deadline, its whole process group is killed: `subprocess.run(timeout=...)`
kills only the direct child and then waits on pipes the grandchildren still
hold open.
"""

from __future__ import annotations

import os
import signal
import subprocess


def run_bounded(
    command: str | list[str], seconds: float, *, shell: bool = False
) -> tuple[int, str, str]:
    """Runs `command`; returns `(exit code, stdout, stderr)`.

    Args:
        command: An argument list, or a shell line with `shell=True`.
        seconds: The deadline.
        shell: Run `command` through `/bin/sh`. Defaults to False.

    Raises:
        subprocess.TimeoutExpired: Past `seconds`, after the process group was
            killed and reaped.

    Example:
    >>> run_bounded(["echo", "gpu0"], 5.0)
    (0, 'gpu0\\n', '')
    """
    process = subprocess.Popen(
        command,
        shell=shell,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.communicate()
        raise
    return process.returncode, out, err
