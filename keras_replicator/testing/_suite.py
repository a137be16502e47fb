"""Runs the conformance checks against named strategies, each in its own processes.

Every factory runs in fresh processes (the CPU split is fixed once TensorFlow
starts, and a stock strategy's failed collective poisons the rest of its process), so
the parent imports no TensorFlow. Multi-worker factories start real workers on
127.0.0.1 through the project's one process runner. A factory that needs more GPUs
than the machine has gives rows with `available=False` and the reason: neither
passed nor failed.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from keras_replicator.launch import run_workers
from keras_replicator.testing._factories import FACTORIES, get_factory
from keras_replicator.testing._worker import RESULT_PREFIX

CHECK_NAMES = (
    "fit_numpy",
    "fit_dataset",
    "sample_weight",
    "validation_data",
    "uneven_last_batch",
    "steps_per_execution",
    "jit_compile",
    "string_dict_inputs",
    "synchronized_batch_norm",
    "mixed_bfloat16",
    "mixed_float16",
    "evaluate",
    "predict",
    "custom_metric",
    "custom_train_step_loss",
    "custom_train_step_mean_loss",
    "variables_in_scope",
    "save_load",
    "restore_other_replica_count",
    "transformer_embeddings",
    "adam_on_embeddings",
    "mixed_float16_overflow",
    "gradient_accumulation",
    "run_eagerly",
    "gradient_clipping",
    "custom_train_step_average_loss",
)
#: Run by default on factories with `layouts=True`, after `CHECK_NAMES`.
LAYOUT_CHECK_NAMES = ("layouts_split_weights",)


@dataclasses.dataclass(frozen=True)
class Row:
    """One (factory, check) outcome, merged over the factory's workers."""

    factory: str
    check: str
    passed: bool
    detail: str
    max_error: float | None = None
    available: bool = True


def run_conformance(
    factories=None,
    checks=None,
    *,
    isolate: bool = False,
    timeout: float = 600.0,
    echo: bool = False,
) -> list[Row]:
    """Runs `checks` on each of `factories` and returns one `Row` per pair.

    Args:
        factories: Factory names. Defaults to `None`: every registered factory.
        checks: Check names. Defaults to `None`: all of `CHECK_NAMES`, and
            `LAYOUT_CHECK_NAMES` too on a factory with `layouts=True`.
        isolate: One process (group) per check instead of per factory: slower, but
            a failing check cannot disturb the next one. Defaults to `False`.
        timeout: Seconds allowed for one process group. Defaults to `600.0`.
        echo: Print the workers' output. Defaults to `False`.

    Returns:
        A list of `Row`s, factory by factory, in check order. A factory that
        cannot run here (e.g. a GPU factory without GPUs) gives rows with
        `passed=False`, `available=False` and the reason in `detail`.

    Example:
    >>> from keras_replicator.testing import run_conformance
    >>> rows = run_conformance(["multi-device-2"], ["fit_numpy"])
    >>> rows[0].passed
    True
    """
    factory_names = list(factories or FACTORIES)
    known = CHECK_NAMES + LAYOUT_CHECK_NAMES
    unknown = [c for c in checks or () if c not in known]
    if unknown:
        raise ValueError(
            f"Unknown conformance checks. Received: checks={unknown}. "
            f"Known: {list(known)}."
        )
    rows = []
    for name in factory_names:
        factory = get_factory(name)
        check_names = list(checks or default_checks(factory))
        batches = [[c] for c in check_names] if isolate else [check_names]
        for batch in batches:
            rows += _run_batch(factory, batch, timeout, echo)
    return rows


def default_checks(factory) -> tuple[str, ...]:
    """The checks `run_conformance` runs on `factory` when none are named."""
    return CHECK_NAMES + (LAYOUT_CHECK_NAMES if factory.layouts else ())


def _run_batch(factory, check_names, timeout, echo):
    command = [
        sys.executable,
        "-m",
        "keras_replicator.testing._worker",
        "--factory",
        factory.name,
        "--checks",
        ",".join(check_names),
    ]
    result = run_workers(command, factory.num_workers, timeout=timeout, echo=echo)
    per_worker = [_parse(worker.output) for worker in result.workers]
    rows = []
    for check in check_names:
        outcomes = [found.get(check) for found in per_worker]
        if any(outcome is None for outcome in outcomes):
            reason = "timed out" if result.timed_out else "worker died"
            failure = result.first_failure
            if failure is not None:
                reason += f" (worker {failure.index} exit {failure.returncode})"
            rows.append(Row(factory.name, check, False, reason))
            continue
        missing = [o for o in outcomes if not o.get("available", True)]
        if missing:
            rows.append(
                Row(factory.name, check, False, missing[0]["detail"], None, False)
            )
            continue
        failed = [o for o in outcomes if not o["passed"]]
        chosen = failed[0] if failed else outcomes[0]
        errors = [o["max_error"] for o in outcomes if o["max_error"] is not None]
        rows.append(
            Row(
                factory.name,
                check,
                not failed,
                chosen["detail"],
                max(errors) if errors else None,
            )
        )
    return rows


def _parse(output: str) -> dict[str, dict]:
    found = {}
    for line in output.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
            found[result["check"]] = result
    return found


def format_table(rows: list[Row]) -> str:
    """A Markdown table: one line per check, one column per factory."""
    factories = list(dict.fromkeys(r.factory for r in rows))
    checks = list(dict.fromkeys(r.check for r in rows))
    cells = {(r.factory, r.check): r for r in rows}
    lines = [
        "| check | " + " | ".join(factories) + " |",
        "|---|" + "---|" * len(factories),
    ]
    for check in checks:
        row = [check]
        for factory in factories:
            cell = cells.get((factory, check))
            if cell is None:
                row.append("")
            elif not cell.available:
                row.append("n/a: " + cell.detail.removeprefix("not available: ")[:60])
            elif cell.passed:
                row.append("pass")
            else:
                row.append("FAIL: " + cell.detail.replace("|", "/")[:60])
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
