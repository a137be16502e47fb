"""Running a short helper command with a deadline and a cap, whatever it starts.

The launcher asks two outside programs questions before it starts workers:
`nvidia-smi` (which GPUs are visible, `_gpus`) and a `--discover` hook (which
slots can run, `_elastic`). Either may hang (a wedged driver, a slow cloud API),
print without end, and start children of its own, so each runs in its own
session (a process group), and:

- its output is read up to `max_bytes` (1 MiB unless told): an answer is a few
  lines, and `subprocess.run` would hold all of it in memory (64 MB of output
  took the launcher from 15 MB to 553 MB);
- past its deadline or its cap, its whole process group is killed:
  `subprocess.run(timeout=...)` kills only the direct child and then waits on
  pipes the grandchildren still hold open;
- when it exits, what it left running in its group is killed too, before the
  command itself is reaped (so the group's id cannot have been reused), and
  `ProcessGroups.close()` ends the groups of commands still running when their
  caller stops (the launcher's exit, a signal): a question outlives neither its
  answer nor the launcher.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time

# An answer is a few lines; more than this is not one.
MAX_OUTPUT_BYTES = 1 << 20


class OutputTooLarge(subprocess.SubprocessError):
    """The command printed more than its cap; it was killed, with its group."""


class ProcessGroups:
    """The process groups of bounded commands still running, to end on `close()`.

    Example:
    >>> groups = ProcessGroups()
    >>> run_bounded(["echo", "a"], 5.0, groups=groups)
    (0, 'a\\n', '')
    >>> groups.close()
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen] = set()
        self._closed = False

    def add(self, process: subprocess.Popen) -> None:
        """Tracks `process`; after `close()`, kills its group at once."""
        with self._lock:
            if not self._closed:
                self._live.add(process)
                return
        _kill_group(process)

    def discard(self, process: subprocess.Popen) -> None:
        with self._lock:
            self._live.discard(process)

    def close(self, seconds: float = 2.0) -> None:
        """Kills every tracked group (SIGKILL) and reaps its leader."""
        with self._lock:
            self._closed = True
            live, self._live = list(self._live), set()
        for process in live:
            _kill_group(process)
        for process in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=seconds)


def run_bounded(
    command: str | list[str],
    seconds: float,
    *,
    shell: bool = False,
    max_bytes: int = MAX_OUTPUT_BYTES,
    groups: ProcessGroups | None = None,
) -> tuple[int, str, str]:
    """Runs `command`; returns `(exit code, stdout, stderr)`.

    Args:
        command: An argument list, or a shell line with `shell=True`.
        seconds: The deadline.
        shell: Run `command` through `/bin/sh`. Defaults to False.
        max_bytes: The most bytes read from stdout and from stderr each.
            Defaults to 1 MiB.
        groups: Where the running command is tracked, so that its owner can
            end it (`ProcessGroups.close()`). Defaults to None.

    Raises:
        subprocess.TimeoutExpired: Past `seconds`, after the process group was
            killed and reaped.
        OutputTooLarge: Past `max_bytes`, likewise.

    Example:
    >>> run_bounded(["echo", "gpu0"], 5.0)
    (0, 'gpu0\\n', '')
    """
    deadline = time.monotonic() + seconds
    process = subprocess.Popen(
        command,
        shell=shell,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    if groups is not None:
        groups.add(process)
    try:
        out, err = _read(process, command, seconds, deadline, max_bytes)
        _wait_unreaped(process, command, seconds, deadline)
    except BaseException:
        _kill_group(process)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5.0)
        raise
    finally:
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        if groups is not None:
            groups.discard(process)
    _kill_group(process)  # what it left running; the leader is a zombie still
    process.wait()
    return process.returncode, _text(out), _text(err)


def _read(process, command, seconds, deadline, max_bytes) -> tuple[bytes, bytes]:
    """Both pipes to their end, or an error past the deadline or the cap."""
    chunks: dict = {process.stdout: [], process.stderr: []}
    sizes = dict.fromkeys(chunks, 0)
    with selectors.DefaultSelector() as selector:
        for pipe in chunks:
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(command, seconds)
            for key, _ in selector.select(remaining):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                sizes[key.fileobj] += len(data)
                if sizes[key.fileobj] > max_bytes:
                    raise OutputTooLarge(
                        f"more than {max_bytes} bytes of output; killed"
                    )
                chunks[key.fileobj].append(data)
    return b"".join(chunks[process.stdout]), b"".join(chunks[process.stderr])


def _wait_unreaped(process, command, seconds: float, deadline: float) -> None:
    """Waits for `process` to exit, leaving it a zombie (its pid stays taken)."""
    while True:
        try:
            if os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                return
        except ChildProcessError:  # reaped already (`ProcessGroups.close`)
            return
        if time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(command, seconds)
        time.sleep(0.01)


def _kill_group(process: subprocess.Popen) -> None:
    if process.returncode is not None:
        return  # reaped: its group id may belong to someone else by now
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
