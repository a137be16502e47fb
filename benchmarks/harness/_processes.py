"""Arms in fresh processes, and the one line through which they report.

An arm that changes process-wide settings (thread pools, allocator, environment,
TF_CONFIG) or that must not inherit a warm cache runs in a new Python process. It
is the benchmark's own module again (`python -m benchmarks.<name> --worker ...`),
run from the repository root so that `from benchmarks import ...` resolves, and it
reports by printing one line `RESULT {json}` (`emit_result`); everything else it
prints is log. `read_result` takes the last such line, or fails with the tail of
the output so that a crashed arm says why.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Sequence

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULT = "RESULT "
TIMEOUT_SECONDS = 900
_TAIL_CHARACTERS = 3000


def module_command(module: str, *args: object) -> list[str]:
    """`python -m module args...` with this interpreter."""
    return [sys.executable, "-m", module, *map(str, args)]


def emit_result(result: dict, tag: str = RESULT) -> None:
    """Prints `result` as the arm's `tag {json}` line (flushed at once)."""
    print(tag + json.dumps(result), flush=True)


def read_result(output: str, what: str, tag: str = RESULT) -> dict:
    """The last `tag {json}` line of `output`, decoded.

    Raises:
        RuntimeError: when there is none, with the output's tail.
    """
    lines = [line for line in output.splitlines() if line.startswith(tag)]
    if not lines:
        raise RuntimeError(f"{what} failed:\n{output[-_TAIL_CHARACTERS:]}")
    return json.loads(lines[-1][len(tag) :])


def module_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` plus a `PYTHONPATH` ending in the repository's root.

    With it `python -m benchmarks...` resolves from any working directory; what
    `PYTHONPATH` already held stays first.
    """
    path = os.environ.get("PYTHONPATH")
    root = str(ROOT) if not path else os.pathsep.join([path, str(ROOT)])
    return {"PYTHONPATH": root, **(env or {})}


def fresh_process(
    command: Sequence[str],
    what: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float = TIMEOUT_SECONDS,
    tag: str = RESULT,
    cwd: str | pathlib.Path = ROOT,
) -> dict:
    """Runs `command` in one new process and returns its result line.

    Args:
        command: The program, usually `module_command(...)`.
        what: Names the arm in the error when it prints no result.
        env: Extra environment variables. Defaults to `None`.
        timeout: Seconds before the process is killed. Defaults to 900.
        tag: The prefix of the result line. Defaults to `"RESULT "`.
        cwd: The working directory. Defaults to the repository's root.
    """
    done = subprocess.run(
        list(command),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **module_environment(env)},
    )
    return read_result(done.stdout + done.stderr, what, tag)


def fresh_workers(
    command: Sequence[str],
    num_workers: int,
    what: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float = TIMEOUT_SECONDS,
    tag: str = RESULT,
    reporting: Sequence[int] | None = None,
) -> list[dict]:
    """Runs `command` as `num_workers` workers of one cluster; their results.

    The workers are started by `keras_replicator.launch.run_workers` (a TF_CONFIG
    on 127.0.0.1 each), so a benchmark's parent process never imports TensorFlow.

    Args:
        command: The program every worker runs, usually `module_command(...)`.
        num_workers: How many worker processes.
        what: Names the arm in the error when a worker prints no result.
        env: Extra environment variables for every worker. Defaults to `None`.
        timeout: Seconds before the workers are stopped. Defaults to 900.
        tag: The prefix of the result line. Defaults to `"RESULT "`.
        reporting: The indices of the workers that print a result. Defaults to
            `None` (every worker).

    Raises:
        RuntimeError: when the workers time out or one of `reporting` prints no
            result.
    """
    from keras_replicator.launch import run_workers

    launched = run_workers(
        list(command),
        num_workers,
        timeout=timeout,
        env=module_environment(env),
        cwd=str(ROOT),
        echo=False,
    )
    if launched.timed_out:
        raise RuntimeError(f"{what}: the workers did not finish in {timeout} s")
    workers = launched.workers
    if reporting is not None:
        workers = [w for w in workers if w.index in reporting]
    return [read_result(w.output, f"{what}, worker {w.index}", tag) for w in workers]
