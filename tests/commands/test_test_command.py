"""`keras-replicator test` with GPU factories, on a machine without GPUs."""

import subprocess
import sys


def _cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "keras_replicator.cli", "test", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_the_gpu_factories():
    out = _cli("--help")
    assert out.returncode == 0
    text = "".join(out.stdout.split())  # argparse may wrap a name at a hyphen
    for name in ("split-gpu-2", "multi-gpu", "multi-worker-gpu-2", "multi-device-2"):
        assert name in text


def test_a_gpu_factory_asked_for_by_name_is_reported_not_passed():
    out = _cli("--factories", "split-gpu-2", "--checks", "fit_numpy,predict")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "| fit_numpy | n/a: needs 1 GPU, this machine has 0 |" in out.stdout
    assert "split-gpu-2: not available: needs 1 GPU" in out.stderr
    assert "checks pass" not in out.stderr
    assert "FAILED split-gpu-2 fit_numpy: not available" in out.stderr
