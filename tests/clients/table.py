"""The "Existing code: stock vs ours" table (docs/guide.md), measured in one run.

`python -m tests.clients.table` (or `make clients`) runs every client case in every
mode, each in fresh processes (2 worker processes on 127.0.0.1 for the multi-worker
tutorials, through the project's runner, with a timeout): one device, the stock
strategy, ours. A cell passes when that mode's results equal the reference (one
device, or the values Keras' own test asserts) within the case's tolerance; a
failing cell says why (the difference, or the error). Only the stock column may
fail: the exit code is 1 if any cell of ours does. This process imports no
TensorFlow.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import subprocess
import sys
import tempfile
import time

from keras_replicator.launch import run_workers
from tests.clients._process import result_path
from tests.clients._registry import Case, Mismatch, compare, load_cases

_REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
_REASON_LENGTH = 70


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one mode of one case gave: results, or why there are none."""

    results: dict | None = None
    error: str | None = None
    seconds: float = 0.0


def run_mode(case: Case, mode: str) -> Outcome:
    """Runs `case` under `mode` in fresh processes and reads back the results."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"kr-client-{case.name}-") as workdir:
        command = [sys.executable, "-m", "tests.clients._process"]
        command += [case.name, mode, workdir]
        workers = case.workers if mode != "one_device" else 1
        timed_out = _run(command, workers, case.timeout)
        outcomes = []
        for index in range(workers):
            path = result_path(workdir, index)
            if os.path.exists(path):
                with open(path, "rb") as file:
                    outcomes.append((os.path.getmtime(path), index, pickle.load(file)))
    seconds = time.monotonic() - started
    errors = sorted(o for o in outcomes if "error" in o[2])
    if errors:
        _, index, outcome = errors[0]  # the first to fail caused the others
        prefix = f"worker {index}: " if workers > 1 else ""
        return Outcome(error=prefix + outcome["error"], seconds=seconds)
    chief = [o for o in outcomes if o[1] == 0]
    if not chief:
        reason = "timed out" if timed_out else "crashed without a result"
        return Outcome(error=reason, seconds=seconds)
    return Outcome(results=chief[0][2]["results"], seconds=seconds)


def _run(command, workers, timeout) -> bool:
    """Runs the command once, or as a worker group; returns whether it timed out."""
    if workers > 1:
        result = run_workers(
            command, workers, timeout=timeout, echo=False, cwd=_REPOSITORY
        )
        return result.timed_out
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    try:
        subprocess.run(
            command,
            cwd=_REPOSITORY,
            env=env,
            timeout=timeout,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return True
    return False


def cell(case: Case, reference: Outcome, outcome: Outcome) -> tuple[str, float | None]:
    """`("pass", max difference)` or `("FAIL: reason", None)`."""
    if outcome.error is not None:
        return "FAIL: " + _short(outcome.error), None
    if reference.error is not None:
        return "FAIL: no reference (one device: " + _short(reference.error) + ")", None
    try:
        return "pass", compare(case, reference.results, outcome.results)
    except Mismatch as error:
        return "FAIL: " + _short(str(error)), None


def _short(text: str) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= _REASON_LENGTH else text[: _REASON_LENGTH - 3] + "..."


def measure(cases: list[Case], echo=print) -> list[dict]:
    """Every case in every mode; one row per case."""
    rows = []
    for case in cases:
        if case.expected is None:
            reference = run_mode(case, "one_device")
        else:
            reference = Outcome(results=case.expected)
        stock = run_mode(case, "stock")
        ours = run_mode(case, "ours")
        stock_cell, _ = cell(case, reference, stock)
        ours_cell, ours_error = cell(case, reference, ours)
        rows.append(
            {
                "case": case.name,
                "origin": case.origin,
                "reference": case.reference,
                "tolerance": case.tolerance,
                "stock": stock_cell,
                "ours": ours_cell,
                "ours_error": ours_error,
            }
        )
        echo(
            f"{case.name}: stock {stock_cell} ({stock.seconds:.0f} s), ours "
            f"{ours_cell} ({ours.seconds:.0f} s)"
        )
    return rows


def format_table(rows: list[dict]) -> str:
    """A Markdown table: case, what it does, reference, stock, ours (max difference)."""
    lines = [
        "| case | existing code | compared with | stock | ours (max difference) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        ours = row["ours"]
        if row["ours_error"] is not None:
            ours += f" ({row['ours_error']:.1g} ≤ {row['tolerance']:g})"
        lines.append(
            f"| `{row['case']}` | {row['origin']} | {row['reference']} | "
            f"{row['stock']} | {ours} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", default="", help="comma-separated case names (default: all)"
    )
    args = parser.parse_args(argv)
    cases = load_cases()
    names = [n for n in args.cases.split(",") if n] or list(cases)
    unknown = [n for n in names if n not in cases]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {list(cases)}")
    rows = measure([cases[n] for n in names], echo=lambda s: print(s, file=sys.stderr))
    print(format_table(rows))
    failed = [row["case"] for row in rows if row["ours"] != "pass"]
    if failed:
        print(f"ours differs from the reference in: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
