"""Echoing the workers' output: bounded lines, and a closed stdout is not fatal.

Each worker's stdout+stderr pipe is drained by one thread (`pump`) for as long as
the worker lives, whatever happens to the launcher's own stdout, because a worker
whose pipe is full blocks in its next `print` and the job hangs. Two rules follow:

- Memory is bounded: a worker writing hundreds of megabytes without a newline (a
  progress bar gone wrong, a binary dump) would otherwise grow the launcher's
  memory by as much. Output is read in chunks of `LINE_BYTES`; a line is kept
  whole up to `MAX_LINE_BYTES` (results that scripts print as one JSON line, such
  as the benchmarks' `RESULT` lines, stay parseable) and split beyond it; the
  kept tail holds at most `TAIL_BYTES`. Bytes are decoded as UTF-8
  incrementally, so a character split between two chunks is not mangled.
- When the launcher's stdout is closed (`keras-replicator launch ... | head -1`,
  the reader exits), echoing stops, the launcher says so once on stderr, and the
  pumps keep draining and keeping the tail for the failure report: the job runs
  to its end instead of hanging. The stdout file descriptor is then pointed at
  `/dev/null`, so the interpreter's final flush does not print a second error.

Hand-written because `subprocess` offers either unbounded `readline` or
`communicate()` (which buffers everything until the end).
"""

from __future__ import annotations

import codecs
import os
import sys
import threading

LINE_BYTES = 8192
MAX_LINE_BYTES = 4 << 20
TAIL_BYTES = 16 << 20


class Echo:
    """Where the workers' output goes: this process's stdout, until it closes.

    Args:
        enabled: Echo at all (`echo=` of `launch()`). Defaults to `True`.

    Example:
    >>> echo = Echo(enabled=False)
    >>> echo.write("[worker 0] ", "hello\\n")
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.lock = threading.Lock()
        self.closed = False

    def write(self, prefix: str, line: str) -> None:
        if not self.enabled or self.closed:
            return
        with self.lock:
            if self.closed:
                return
            try:
                sys.stdout.write(prefix + line)
                sys.stdout.flush()
            except (OSError, ValueError):  # BrokenPipeError, EIO, closed file
                self.closed = True
                _silence_stdout()
                note(
                    "stdout was closed; the workers keep running and their "
                    "output is no longer echoed (the last lines are kept for "
                    "the error report)."
                )


def pump(stream, prefix: str, tail, echo: Echo) -> None:
    """Reads a worker's output until EOF into `tail` (a bounded deque) and `echo`."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    kept = _Tail(tail)
    pending, size = [], 0
    while True:
        try:
            chunk = stream.readline(LINE_BYTES)
        except (OSError, ValueError):
            break
        if not chunk:
            break
        pending.append(chunk)
        size += len(chunk)
        if not chunk.endswith(b"\n") and size < MAX_LINE_BYTES:
            continue  # the line goes on; a longer one is split here
        line = decoder.decode(b"".join(pending))
        pending, size = [], 0
        if not line:  # only part of a multi-byte character so far
            continue
        if not line.endswith("\n"):
            line += "\n"  # a line longer than MAX_LINE_BYTES continues
        kept.append(line)
        echo.write(prefix, line)
    rest = decoder.decode(b"".join(pending), final=True)
    if rest:
        if not rest.endswith("\n"):
            rest += "\n"
        kept.append(rest)
        echo.write(prefix, rest)


class _Tail:
    """Appends to a deque, dropping its oldest lines beyond `TAIL_BYTES` in all."""

    def __init__(self, lines):
        self.lines = lines
        self.size = sum(len(line) for line in lines)

    def append(self, line: str) -> None:
        if self.lines.maxlen is not None and len(self.lines) == self.lines.maxlen:
            self.size -= len(self.lines[0])  # the deque drops it on append
        self.lines.append(line)
        self.size += len(line)
        while self.size > TAIL_BYTES and len(self.lines) > 1:
            self.size -= len(self.lines.popleft())


def note(message: str) -> None:
    """One launcher note on stderr; silent when stderr is gone too (SIGHUP)."""
    try:
        print(f"keras-replicator launch: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _silence_stdout() -> None:
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a notebook's stream): nothing to flush at exit
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, descriptor)
    finally:
        os.close(null)
