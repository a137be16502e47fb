"""Medians over rounds, and ratios to a baseline measured in the same run.

A median over rounds shrugs off one descheduled round; the range (min, max) says
how far the rounds spread. A ratio is only ever taken against the same run's
baseline or ceiling: numbers from different runs differ by more than most effects
measured here.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence


def median_and_range(values: Iterable[float]) -> dict[str, float]:
    """`{"median": ..., "min": ..., "max": ...}` of `values`."""
    values = list(values)
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def medians(runs: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each arm's median over its rounds; an arm without results is left out."""
    return {arm: statistics.median(values) for arm, values in runs.items() if values}


def ratios(values: Mapping[str, float], baseline: str) -> dict[str, float]:
    """Each arm's value divided by the baseline arm's value from the same run.

    Raises:
        ValueError: if the baseline arm is not among `values`.
    """
    if baseline not in values:
        raise ValueError(
            f"The baseline arm {baseline!r} must be measured in the same run. "
            f"Received arms: {sorted(values)}."
        )
    return {arm: value / values[baseline] for arm, value in values.items()}


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table: the header row, the rule, one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def over_seeds(
    values: Mapping[str, Sequence[float]], baseline: str
) -> dict[str, dict[str, float]]:
    """Each arm's mean and spread over seeds, and its mean against the baseline's.

    Per arm: `mean`, `std` (0 for one seed), `diff` (mean - the baseline's mean)
    and `ratio` (mean / the baseline's mean).

    Raises:
        ValueError: if the baseline arm is not among `values`.
    """
    means = {arm: statistics.mean(v) for arm, v in values.items()}
    ratio = ratios(means, baseline)
    return {
        arm: {
            "mean": means[arm],
            "std": statistics.stdev(v) if len(v) > 1 else 0.0,
            "diff": means[arm] - means[baseline],
            "ratio": ratio[arm],
        }
        for arm, v in values.items()
    }
