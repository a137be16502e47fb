"""One case in one mode in this fresh process: `python -m tests.clients._process`.

Usage: `python -m tests.clients._process CASE MODE WORKDIR`. A local case splits the
CPU into 2 logical devices before TensorFlow starts. The results (or the error, as
`Type: message`) are pickled to `WORKDIR/result-<worker index>.pkl`; an error also
prints its traceback and exits with 1, so the runner stops the other workers
instead of leaving them waiting in a collective.
"""

from __future__ import annotations

import os
import pickle
import re
import sys
import traceback

RESULT_FILE = "result-{index}.pkl"


def result_path(workdir: str, index: int) -> str:
    return os.path.join(workdir, RESULT_FILE.format(index=index))


def reason(error: Exception) -> str:
    """The line of an error message that says what went wrong.

    TensorFlow's op errors open with "Graph execution error:" and the node's
    traceback; the cause ("You must feed a value for placeholder tensor ...") comes
    after. A `PerReplica` value printed in a message is shortened to its type.
    """
    text = re.sub(r"\(PerReplica:\{.*?\}\)", "(PerReplica)", str(error), flags=re.S)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:  # "(0) INVALID_ARGUMENT:  You must feed a value ..."
        status = re.match(r"\(\d+\) [A-Z_]+:\s*(.+)", line)
        if status:
            return status.group(1)
    for line in lines:
        if not line.endswith(":") and not line.startswith(_NOISE):
            return line
    return lines[0] if lines else ""


_NOISE = ("Detected at node", "File ", "[[", "{{", "Traceback")


def main(argv=None) -> int:
    name, mode, workdir = argv if argv is not None else sys.argv[1:]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tests.clients._registry import REPLICAS, load_cases, run_case

    case = load_cases()[name]
    if case.workers == 1:
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS
        )
    index = int(os.environ.get("KERAS_REPLICATOR_WORKER_INDEX", "0"))
    try:
        outcome = {"results": run_case(name, mode, workdir)}
        code = 0
    except Exception as error:  # noqa: BLE001 - every failure is a table cell
        traceback.print_exc()
        outcome = {"error": f"{type(error).__name__}: {reason(error)}"}
        code = 1
    with open(result_path(workdir, index), "wb") as file:
        pickle.dump(outcome, file)
    return code


if __name__ == "__main__":
    sys.exit(main())
