"""`keras-replicator env`: versions, the supported-range check, the upstream check."""

import subprocess
import sys

from keras_replicator import _compat


def test_env_prints_the_versions_the_range_and_the_upstream_check():
    out = subprocess.run(
        [sys.executable, "-m", "keras_replicator.cli", "env"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    import keras
    import tensorflow as tf

    assert f"tensorflow {tf.__version__}, keras {keras.__version__}" in out.stdout
    wanted = ", ".join(f"{n}{s}" for n, s in _compat.SUPPORTED_VERSIONS.items())
    assert f"supported range: {wanted}: ok" in out.stdout
    assert f"upstream check: ok ({len(_compat.PATCHES)} patches" in out.stdout
