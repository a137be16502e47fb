"""`stop_on_signals`: the first signal raises, later ones cannot interrupt the stop."""

import os
import signal

import pytest

from keras_replicator.launch._signals import (
    StopSignal,
    signals_deferred,
    stop_on_signals,
)


def test_a_second_signal_does_not_interrupt_the_cleanup(capsys):
    cleaned = []
    with stop_on_signals():
        with pytest.raises(StopSignal) as stop:
            try:
                os.kill(os.getpid(), signal.SIGINT)
            finally:
                os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C
                cleaned.append(True)
    assert stop.value.exit_code == 130 and cleaned == [True]
    assert "received SIGINT again" in capsys.readouterr().err


def test_a_signal_during_a_deferred_block_is_raised_at_its_end():
    steps = []
    with stop_on_signals():
        with pytest.raises(StopSignal):
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                steps.append("recorded")
    assert steps == ["recorded"]


def test_handlers_are_restored():
    before = signal.getsignal(signal.SIGHUP)
    with stop_on_signals():
        assert signal.getsignal(signal.SIGHUP) is not before
    assert signal.getsignal(signal.SIGHUP) is before
