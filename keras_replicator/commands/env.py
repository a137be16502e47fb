"""`keras-replicator env`: versions and devices, for bug reports."""

from __future__ import annotations

import platform
import sys


def add_parser(subparsers):
    parser = subparsers.add_parser("env", help="print versions and devices")
    parser.set_defaults(command=run)
    return parser


def run(args) -> int:
    import keras
    import tensorflow as tf

    import keras_replicator

    print(f"keras_replicator {keras_replicator.__version__}")
    print(f"python {platform.python_version()} on {platform.platform()}")
    print(f"tensorflow {tf.__version__}, keras {keras.__version__}")
    for kind in ("CPU", "GPU", "TPU"):
        print(f"{kind}: {len(tf.config.list_physical_devices(kind))} physical")
    sys.stdout.flush()
    return 0
