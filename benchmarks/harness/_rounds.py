"""Interleaved rounds: every arm once per round, so drift hits every arm alike.

A machine's speed drifts over a run (another job, thermal state, page cache). Timing
all rounds of one arm, then all of the next, would put that drift between arms;
running each arm once per round spreads it over all of them. Rotating the order
from round to round also spreads what running first or last costs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

Arm = TypeVar("Arm")
Result = TypeVar("Result")


def rotate(arms: Sequence[Arm], round_index: int) -> list[Arm]:
    """`arms` starting at `round_index` (modulo), so each arm leads one round."""
    start = round_index % len(arms)
    return list(arms[start:]) + list(arms[:start])


def interleave(
    arms: Sequence[Arm],
    rounds: int,
    measure: Callable[[Arm], Result],
    *,
    rotating: bool = False,
    label: Callable[[Arm, Result], str] | None = None,
) -> dict[Arm, list[Result]]:
    """Runs `measure(arm)` for every arm, round after round.

    Args:
        arms: The arms, in the order of the first round.
        rounds: How many rounds.
        measure: Runs one arm once and returns its result.
        rotating: Start each round one arm later (`rotate`). Defaults to `False`.
        label: A progress line for one result, printed to stderr. Defaults to
            `None`, which prints one line per round.

    Returns:
        Each arm's results, one per round, in round order.
    """
    results: dict[Arm, list[Result]] = {arm: [] for arm in arms}
    for round_index in range(rounds):
        order = rotate(arms, round_index) if rotating else list(arms)
        for arm in order:
            result = measure(arm)
            results[arm].append(result)
            if label is not None:
                print(f"round {round_index + 1}: {label(arm, result)}", flush=True)
        print(f"round {round_index + 1} of {rounds} done", file=sys.stderr, flush=True)
    return results
