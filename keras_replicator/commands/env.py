"""`keras-replicator env`: versions, the supported-range check, devices.

For bug reports, and to see before training whether this Keras / TensorFlow pair is
one keras_replicator was verified on: it prints the running versions against the
supported range (the check every strategy constructor runs) and the result of the
upstream check (the source digests of every Keras internal we replace).
"""

from __future__ import annotations

import platform
import sys


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "env", help="print versions, the supported-range check and devices"
    )
    parser.set_defaults(command=run)
    return parser


def run(args) -> int:
    import tensorflow as tf

    import keras_replicator

    print(f"keras_replicator {keras_replicator.__version__}")
    print(f"python {platform.python_version()} on {platform.platform()}")
    try:
        from keras_replicator import _compat
    except RuntimeError as error:  # UnsupportedVersionError: internals not found
        print(f"supported range: {error}")
        return 1
    report = _compat._versions.report()
    found = ", ".join(f"{name} {version}" for name, version in report.found.items())
    print(found)
    wanted = ", ".join(
        f"{name}{spec}" for name, spec in _compat.SUPPORTED_VERSIONS.items()
    )
    verdict = "ok" if report.ok else "UNSUPPORTED: " + ", ".join(report.unsupported)
    print(f"supported range: {wanted}: {verdict}")
    changed = _compat.check_upstream()
    if changed:
        print(f"upstream check: {len(changed)} internals changed")
        for name, what in sorted(changed.items()):
            print(f"  {name}: {what}")
    else:
        print(
            f"upstream check: ok ({len(_compat.PATCHES)} patches, "
            f"{len(_compat.UPSTREAM_DIGESTS) + len(_compat.WORKER_FILES_DIGESTS)} "
            "digests unchanged)"
        )
    if not report.ok:
        print(
            f"strategies will refuse to start; set "
            f"{_compat._versions.ALLOW_UNSUPPORTED}=1 to run anyway with a warning"
        )
    for kind in ("CPU", "GPU", "TPU"):
        print(f"{kind}: {len(tf.config.list_physical_devices(kind))} physical")
    sys.stdout.flush()
    return 0
