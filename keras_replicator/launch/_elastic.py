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
  (not counted as a restart; the workers get `resize_grace_seconds` to back up,
  and a worker still running then is killed and the resize counts as one,
  `_group_outcome.py`).

The global batch is the user's, so every replica's share changes with the
number of workers and the numbers keep following one device (docs/preemption.md).

A hook's answer is bounded: a command's output is read up to 1 MiB, and a slot
is at most `MAX_SLOT_CHARS` printable characters (it becomes an environment
variable: a NUL byte or a line over 128 KiB made starting the workers fail, also
mid-run after the group was stopped). A longer or invalid answer is a failed
question, as a hook that exits non-zero is: the slots stay as last known. The
command runs in a process group of its own, killed and reaped when it ends and
when the launcher stops (`Discovery.close()`, also on a signal).

Hand-written: torchrun's elastic agent and Horovod's host discovery do this for
PyTorch / Horovod processes, not for TensorFlow workers, whose cluster is fixed
when each process starts; here each size is simply a new group with fresh ports.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable

from keras_replicator.launch._bounded_run import ProcessGroups, run_bounded
from keras_replicator.launch._output import note

DiscoverHook = str | Callable[[], Iterable[str]]
# Longest a discovery command may run before its answer counts as unknown.
_DISCOVER_TIMEOUT = 30.0
# Longest slot: plenty for a host name, an address or a GPU id.
MAX_SLOT_CHARS = 4096


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
        self._latest_ticket = 0  # which question `_latest` answers
        self._tickets = itertools.count(1)
        self._last_error: str | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._groups = ProcessGroups()  # the commands running now

    @property
    def latest(self) -> tuple[str, ...] | None:
        """The slots of the newest answer; `None` before any good answer."""
        with self._lock:
            return self._latest

    def ask(self) -> tuple[str, ...] | None:
        """Asks the hook now; the slots, or `None` when it failed (noted).

        The hook runs on a thread of its own, given `_DISCOVER_TIMEOUT`
        seconds. Answers to older questions (the background thread's, when the
        main thread asked later and heard first) do not replace newer ones.
        """
        with self._lock:
            ticket = next(self._tickets)
        try:
            lines = _with_timeout(self._lines, _DISCOVER_TIMEOUT + 5)
        except Exception as error:  # noqa: BLE001 - any failure: answer unknown
            self._failed(f"{type(error).__name__}: {error}")
            return None
        slots = tuple(line.strip() for line in lines if line.strip())
        bad = next((slot for slot in slots if not _valid_slot(slot)), None)
        if bad is not None:
            self._failed(
                f"a slot must be at most {MAX_SLOT_CHARS} printable characters; "
                f"got {len(bad)} starting {bad[:40]!r}"
            )
            return None
        with self._lock:
            if ticket > self._latest_ticket:
                self._latest, self._latest_ticket = slots, ticket
            self._last_error = None
        return slots

    def _lines(self) -> list[str]:
        if not callable(self.discover):
            return _run_command(self.discover, self._groups)
        answer = self.discover()
        if isinstance(answer, str):
            return answer.splitlines()
        return [str(line) for line in answer]

    def start(self) -> None:
        """Asks every `every_seconds` on a daemon thread until `close()`."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="launch-discovery", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Stops the background questions and kills a command still running.

        The command's whole process group is killed (SIGKILL) and reaped; a
        callable hook still running is left to end.
        """
        self._closed.set()
        self._groups.close()
        if self._thread is not None:
            self._thread.join(timeout=0.5)

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
                    f"discover: {count}, fewer than the {fewest} needed; waiting "
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
        if self.echo and not repeated and not self._closed.is_set():
            note(f"discover failed ({error}); the slots stay as last known.")


def workers_for(slots: tuple[str, ...], most: int) -> int:
    """How many workers the slots allow: all of them up to `most`.

    Example:
    >>> workers_for(("a", "b"), most=3), workers_for(("a", "b", "c", "d"), most=3)
    (2, 3)
    """
    return min(len(slots), most)


def resize_wanted(running, latest, most: int, fewest: int) -> bool:
    """Whether the group on slots `running` should be stopped and resized.

    Yes when the newest answer (`latest`) allows another number of workers, or
    drops a slot a worker runs in; no without an answer, or when it allows fewer
    than `fewest` (a hook that briefly lists nothing does not stop a healthy
    group: a lost worker does, as a failure).

    Example:
    >>> resize_wanted(("a", "b"), ("a", "b", "c"), most=3, fewest=2)
    True
    >>> resize_wanted(("a", "b"), ("a", "c"), most=3, fewest=2)
    True
    >>> resize_wanted(("a", "b"), ("b", "a"), most=3, fewest=2)
    False
    >>> resize_wanted(("a", "b"), (), most=3, fewest=2)
    False
    """
    if latest is None:
        return False
    wanted = workers_for(latest, most)
    if wanted < fewest:
        return False
    return wanted != len(running) or any(slot not in latest for slot in running)


def _valid_slot(slot: str) -> bool:
    return len(slot) <= MAX_SLOT_CHARS and slot.isprintable()


def _run_command(command: str, groups: ProcessGroups) -> list[str]:
    """The command's output lines; its whole process group ends with it."""
    returncode, out, err = run_bounded(
        command, _DISCOVER_TIMEOUT, shell=True, groups=groups
    )
    if returncode != 0:
        detail = (err or out).strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"exit code {returncode} {detail[0]}".strip())
    return out.splitlines()


def _with_timeout(function, seconds: float):
    """`function()` on a daemon thread; `TimeoutError` after `seconds`."""
    outcome: list = []

    def run():
        try:
            outcome.append((True, function()))
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            outcome.append((False, error))

    thread = threading.Thread(target=run, name="launch-discover-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        raise TimeoutError(f"no answer within {seconds:g} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value
