"""Entry point of one conformance process: `python -m keras_replicator.testing._worker`.

Splits the CPU as the factory asks (before TensorFlow starts), builds the strategy,
runs the named checks in order and prints one `KR_RESULT <json>` line per check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

RESULT_PREFIX = "KR_RESULT "


def run_checks_here(factory, check_names):
    """Builds `factory`'s strategy in this process and runs the checks on it."""
    from keras_replicator.testing._checks import CHECKS
    from keras_replicator.testing._harness import CheckResult

    try:
        strategy = factory.build()
    except Exception as error:  # noqa: BLE001 - reported as a failed row
        message = f"strategy could not be built: {type(error).__name__}: {error}"
        return [CheckResult(name, False, message) for name in check_names]
    results = []
    for name in check_names:
        function, _ = CHECKS[name]
        try:
            worst, _ = function(strategy)
            results.append(CheckResult(name, True, "ok", max_error=worst))
        except Exception as error:  # noqa: BLE001 - every failure becomes a row
            first_line = (str(error).strip().splitlines() or [""])[0][:300]
            detail = f"{type(error).__name__}: {first_line}"
            if os.environ.get("KERAS_REPLICATOR_VERBOSE"):
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
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * factory.logical_cpus
    )
    for result in run_checks_here(factory, args.checks.split(",")):
        print(RESULT_PREFIX + json.dumps(result.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
