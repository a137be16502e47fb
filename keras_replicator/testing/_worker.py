"""Entry point of one conformance process: `python -m keras_replicator.testing._worker`.

Splits the CPU and hides, checks or shares out the GPUs as the factory asks (before
TensorFlow starts), builds the strategy, runs the named checks in order with
TensorFloat-32 off and prints one `KR_RESULT <json>` line per check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from keras_replicator._environment import VERBOSE, WORKER_INDEX

RESULT_PREFIX = "KR_RESULT "


def prepare_devices(factory) -> str | None:
    """Sets this process's devices for `factory`; the reason if it cannot run here.

    Called before TensorFlow initialises its devices. Splits the CPU into
    `factory.logical_cpus`; hides the GPUs of a CPU factory (`gpus=0`); gives
    each worker of a GPU factory its share of the GPUs.

    Example:
    >>> from keras_replicator.testing._factories import get_factory
    >>> prepare_devices(get_factory("multi-gpu"))  # on a machine without GPUs
    'not available: needs 2 GPUs, this machine has 0'
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * factory.logical_cpus
    )
    if factory.gpus is None:
        return None
    gpus = tf.config.get_visible_devices("GPU")
    if factory.gpus == 0:
        tf.config.set_visible_devices([], "GPU")
        return None
    if len(gpus) < factory.gpus:
        return (
            f"not available: needs {factory.gpus} GPU"
            f"{'s' if factory.gpus > 1 else ''}, this machine has {len(gpus)}"
        )
    if factory.num_workers > 1:
        share = len(gpus) // factory.num_workers
        index = int(os.environ.get(WORKER_INDEX, "0"))
        tf.config.set_visible_devices(gpus[index * share : (index + 1) * share], "GPU")
    return None


def run_checks_here(factory, check_names):
    """Builds `factory`'s strategy in this process and runs the checks on it.

    Each check runs with TensorFloat-32 off (`_harness.exact_float32`).
    """
    from keras_replicator.testing._checks import CHECKS
    from keras_replicator.testing._harness import CheckResult, exact_float32

    try:
        strategy = factory.build()
    except Exception as error:  # noqa: BLE001 - reported as a failed row
        message = f"strategy could not be built: {type(error).__name__}: {error}"
        return [CheckResult(name, False, message) for name in check_names]
    results = []
    for name in check_names:
        function, _ = CHECKS[name]
        try:
            with exact_float32():
                worst, _ = function(strategy)
            results.append(CheckResult(name, True, "ok", max_error=worst))
        except Exception as error:  # noqa: BLE001 - every failure becomes a row
            first_line = (str(error).strip().splitlines() or [""])[0][:300]
            detail = f"{type(error).__name__}: {first_line}"
            if os.environ.get(VERBOSE):
                traceback.print_exc()
            results.append(CheckResult(name, False, detail))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--factory", required=True)
    parser.add_argument("--checks", required=True, help="comma-separated names")
    args = parser.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from keras_replicator.testing._factories import get_factory

    factory = get_factory(args.factory)
    check_names = args.checks.split(",")
    unavailable = prepare_devices(factory)
    if unavailable:
        from keras_replicator.testing._harness import CheckResult

        results = [
            CheckResult(name, False, unavailable, available=False)
            for name in check_names
        ]
    else:
        results = run_checks_here(factory, check_names)
    for result in results:
        print(RESULT_PREFIX + json.dumps(result.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
