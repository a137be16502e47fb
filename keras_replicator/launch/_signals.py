"""Stopping the launcher: SIGHUP, SIGTERM and SIGINT all stop the workers first.

The workers run in sessions of their own (so a Ctrl-C in the terminal reaches the
launcher only, which then stops them in order, and so stopping a worker stops its
children too). That makes the launcher responsible for them: a signal that kills
it outright would leave them running. So `stop_on_signals()` turns the first
SIGHUP (terminal closed, ssh dropped), SIGTERM or SIGINT into a `StopSignal`
exception in the main thread, which unwinds through the runner's `finally:` that
stops the workers (SIGTERM, then SIGKILL after the grace period).

A second signal while the workers are being stopped must not cut that short: with
Python's default handlers a second Ctrl-C raises `KeyboardInterrupt` inside the
wait and skips the SIGKILL, orphaning any worker that ignores SIGTERM. Here later
signals only print a note; the runner's stop routine is also written so that any
exception during the grace period sends SIGKILL at once rather than skipping it.

Where the first signal may raise matters too. The runner polls its workers and
stops them inside `signals_deferred()` blocks, so the `StopSignal` comes out of
its sleep or at the end of a block, never from inside `subprocess.Popen.poll()`
after it took the process's wait lock: a lock left taken there made the stop's
`wait()` block forever (rare: 1 of about 400 stress launches hung so; a CI run
found it).
The launcher's last line of defence, when it is SIGKILLed itself, is the reaper
(`_reaper.py`).
"""

from __future__ import annotations

import contextlib
import signal
import threading

from keras_replicator.launch._output import note

STOP_SIGNALS = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


class StopSignal(BaseException):
    """The launcher received `signum`; the workers are stopped as this unwinds.

    A `BaseException`, as `KeyboardInterrupt` is: no `except Exception` on the
    way out may take it for an ordinary failure and carry on (a discovery
    question that the signal interrupted used to be noted as failed, and the
    launch went on waiting for slots).
    """

    def __init__(self, signum: int):
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal number (130 for Ctrl-C)."""
        return 128 + self.signum


class _State:
    """Shared by the handler and `signals_deferred` (both run in the main thread)."""

    def __init__(self):
        self.received: list[int] = []
        self.deferring = 0
        self.pending: int | None = None


_state = _State()


@contextlib.contextmanager
def stop_on_signals(signals=STOP_SIGNALS):
    """Within the block, the first of `signals` raises `StopSignal`; later ones note.

    Only the main thread can install signal handlers; elsewhere this does nothing.

    Example:
    >>> import os, signal
    >>> with stop_on_signals():
    ...     try:
    ...         os.kill(os.getpid(), signal.SIGHUP)
    ...     except StopSignal as stop:
    ...         print(stop, stop.exit_code)
    received SIGHUP 129
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _state
    outer, _state = _state, _State()

    def handler(signum, frame):
        if _state.received:
            with contextlib.suppress(RuntimeError):  # stderr busy in this thread
                note(
                    f"received {signal.Signals(signum).name} again; the workers "
                    "are being stopped (SIGKILL after the grace period for any "
                    "still running)."
                )
            return
        _state.received.append(signum)
        if _state.deferring:
            _state.pending = signum
            return
        raise StopSignal(signum)

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _state = outer


@contextlib.contextmanager
def signals_deferred():
    """A `StopSignal` due in the block is raised at its end instead.

    The runner starts a worker and records it in one such block: a `StopSignal`
    raised between `Popen()` and the line that records the new process would
    leave that worker unknown to the runner, so never stopped. (Python runs
    signal handlers in the main thread, where the runner starts workers.) The
    runner polls its workers in such blocks too: `Popen.poll()` takes a lock
    before its `try:`, and a `StopSignal` raised in between would leave the lock
    taken and hang the `wait()` that stops the workers. Elsewhere than in the
    main thread this does nothing (signals never arrive there).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = _state
    state.deferring += 1
    try:
        yield
    finally:
        state.deferring -= 1
        if not state.deferring and state.pending is not None:
            signum, state.pending = state.pending, None
            raise StopSignal(signum)
