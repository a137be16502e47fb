"""Elastic launches: how many workers to run, from what a discovery hook says.

`launch(..., min_workers=M, discover=...)` (`--min-workers M --discover CMD`)
runs between M and `num_workers` workers, as many as there are slots. A slot is
one line of what `discover` prints (a shell command, or a Python callable
returning strings): one per worker that can run now, e.g. the healthy GPUs
(`nvidia-smi --query-gpu=index --format=csv,noheader`), the spot capacity a
scheduler grants, or a file an operator edits. Each worker gets its slot's text
as `KERAS_REPLICATOR_SLOT`.

`Discovery` asks the hook every `every_seconds` on a thread of its own, so the
launcher's supervision loop only reads the latest answer. The launcher (see
`_launcher.py`) then:

- **shrinks** after a failure: the group is started again (one of the
  `max_restarts`) on the slots discovery lists now, down to M, and resumes from
  the last `BackupAndRestore` backup; with fewer than M slots it waits for them
  (until `timeout`);
- **resizes on purpose** when the slots change while the group runs (a slot
  came back, or one is announced gone before it fails): it stops the workers with
  SIGTERM, which `BackupAndRestore` turns into a backup at a step every worker
  agrees on and an exit with 0, and starts them again on the new number of slots
  (not counted as a restart).

The global batch is the user's, so every replica's share changes with the
number of workers and the numbers keep following one device (docs/preemption.md).

Hand-written: torchrun's elastic agent and Horovod's host discovery do this for
PyTorch / Horovod processes, not for TensorFlow workers, whose cluster is fixed
when each process starts; here each size is simply a new group with fresh ports.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterable

from keras_replicator.launch._output import note

DiscoverHook = str | Callable[[], Iterable[str]]
# Longest a discovery command may run before its answer counts as unknown.
_DISCOVER_TIMEOUT = 30.0


class Discovery:
    """The slots a discovery hook lists, asked again every `every_seconds`.

    Args:
        discover: A shell command printing one slot per line, or a callable
            returning the slots as strings.
        every_seconds: Seconds between two questions on the background thread.
        echo: Print a note when the hook fails (once per distinct error).

    Example:
    >>> discovery = Discovery("printf 'gpu0\\ngpu1\\n'", every_seconds=1.0)
    >>> discovery.ask()
    ('gpu0', 'gpu1')
    """

    def __init__(self, discover: DiscoverHook, every_seconds: float, echo=True):
        self.discover = discover
        self.every_seconds = every_seconds
        self.echo = echo
        self._latest: tuple[str, ...] | None = None
        self._last_error: str | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def latest(self) -> tuple[str, ...] | None:
        """The slots of the newest answer; `None` before any good answer."""
        with self._lock:
            return self._latest

    def ask(self) -> tuple[str, ...] | None:
        """Asks the hook now; the slots, or `None` when it failed (noted)."""
        try:
            if callable(self.discover):
                lines = [str(line) for line in self.discover()]
            else:
                lines = _run_command(self.discover)
        except Exception as error:  # noqa: BLE001 - any failure: answer unknown
            self._failed(f"{type(error).__name__}: {error}")
            return None
        slots = tuple(line.strip() for line in lines if line.strip())
        with self._lock:
            self._latest = slots
            self._last_error = None
        return slots

    def start(self) -> None:
        """Asks every `every_seconds` on a daemon thread until `close()`."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="launch-discovery", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=_DISCOVER_TIMEOUT + 1)

    def wait_for(self, fewest: int, deadline: float | None) -> tuple[str, ...] | None:
        """Asks until at least `fewest` slots are listed; `None` at the deadline."""
        said = False
        while True:
            slots = self.ask()
            if slots is not None and len(slots) >= fewest:
                return slots
            if self.echo and not said:
                count = "no answer" if slots is None else f"{len(slots)} slot(s)"
                note(
                    f"discover: {count}, fewer than min_workers={fewest}; waiting "
                    f"for slots (asking every {self.every_seconds:g} s)."
                )
                said = True
            if deadline is not None and time.monotonic() >= deadline:
                return None
            pause = self.every_seconds
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            time.sleep(pause)

    def _loop(self) -> None:
        while not self._closed.wait(self.every_seconds):
            self.ask()

    def _failed(self, error: str) -> None:
        with self._lock:
            repeated = error == self._last_error
            self._last_error = error
        if self.echo and not repeated:
            note(f"discover failed ({error}); keeping the last answer.")


def workers_for(slots: tuple[str, ...] | None, current: int, most: int) -> int:
    """How many workers the slots allow: all of them up to `most`.

    With no answer yet (`None`), the current number stands.

    Example:
    >>> workers_for(("a", "b"), current=3, most=3), workers_for(None, 3, 3)
    (2, 3)
    """
    if slots is None:
        return current
    return min(len(slots), most)


def _run_command(command: str) -> list[str]:
    run = subprocess.run(
        command,
        shell=True,
        capture_output=True,
        text=True,
        timeout=_DISCOVER_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    if run.returncode != 0:
        detail = (run.stderr or run.stdout).strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"exit code {run.returncode} {detail[0]}".strip())
    return run.stdout.splitlines()
