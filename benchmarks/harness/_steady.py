"""Steady state: the median interval between batches once the warm-up is over.

A `fit` call's first batches trace functions, build iterators and, on workers,
connect; timing the whole call would measure that set-up as much as the step. The
benchmarks stamp the end of every batch instead and take the median interval after
the first `skip` batches, so one descheduled batch does not decide either.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any


def batch_end_stamps(keras: Any) -> tuple[Any, list[float]]:
    """A Keras callback stamping each batch's end, and the list it appends to.

    Args:
        keras: The `keras` module (imported by the caller, after its thread setup).
    """
    stamps: list[float] = []

    class BatchEndStamps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            stamps.append(time.perf_counter())

    return BatchEndStamps(), stamps


def steady_interval(stamps: Sequence[float], skip: int) -> float:
    """The median interval between consecutive stamps after the first `skip`."""
    steady = stamps[skip:]
    return statistics.median(b - a for a, b in zip(steady, steady[1:]))
