"""keras_replicator installs beside `tensorflow-tpu`, in a fresh virtualenv (issue 48).

`tensorflow` and `tensorflow-tpu` are different distributions of the same
`tensorflow` package: were TensorFlow a hard requirement, pip would install the
CPU build over the TPU one. The `[tpu]` extra installs `tensorflow-tpu` instead;
this test installs it as a TPU VM user would, then checks that pip sees no
conflict, that the only TensorFlow is the TPU build, and that the version gate
passes on it. No TPU is needed: nothing here initialises one, and
`TPU_LOAD_LIBRARY=0` keeps TensorFlow from loading libtpu at import (off a TPU
VM, libtpu 0.0.14 waits for the cloud metadata server; a libtpu without
TensorFlow's entry points, 0.0.45 and newer, aborts the import).

Slow (`make test-slow`): it downloads about 0.5 GB (tensorflow-tpu and libtpu)
unless `KERAS_REPLICATOR_WHEELS` names a folder holding their wheels (`pip
download --no-deps tensorflow-tpu==2.20.0 libtpu -d DIR`); pip's cache serves
the rest after the first run.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).parents[2]
TENSORFLOW_TPU = "tensorflow-tpu==2.20.0"  # the newest on PyPI

CHECK = textwrap.dedent(
    """
    import keras_replicator as kr
    from keras_replicator import _compat
    from keras_replicator._compat import _versions
    print("BUILDS", _versions.tensorflow_distributions())
    report = _versions.check_versions(_compat.check_upstream, environ={})
    print("GATE", report.ok, report.describe())
    strategy = kr.MultiDeviceReplicator(num_replicas=1)  # the installer's own gate
    print("STRATEGY", strategy.num_replicas_in_sync)
    """
)


def _run(command, **kwargs):
    out = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, **kwargs
    )
    assert out.returncode == 0, (command, out.stdout[-3000:], out.stderr[-3000:])
    return out.stdout


@pytest.mark.slow
def test_installs_beside_tensorflow_tpu(tmp_path):
    # A copy of the sources: the build writes no egg-info into the checkout.
    source = tmp_path / "source"
    shutil.copytree(
        ROOT / "keras_replicator",
        source / "keras_replicator",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], timeout=300)
    python = venv / "bin" / "python"
    install = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if os.environ.get("KERAS_REPLICATOR_WHEELS"):
        install += ["--find-links", os.environ["KERAS_REPLICATOR_WHEELS"]]
    # A TPU VM's order: TensorFlow's TPU build first, then us with the extra.
    _run([*install, TENSORFLOW_TPU], timeout=1500)
    _run([*install, f"{source}[tpu]"], timeout=900)
    _run([python, "-m", "pip", "check"], timeout=120)
    versions = _run([python, "-m", "pip", "list", "--format=freeze"], timeout=120)
    print(versions)  # which libtpu the extra's range resolved to
    assert "\ntensorflow==" not in f"\n{versions}", versions  # no CPU build over it
    out = _run(
        [python, "-c", CHECK],
        timeout=600,
        cwd=tmp_path,
        env={
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": "",
            "TPU_LOAD_LIBRARY": "0",
        },
    )
    assert "BUILDS {'tensorflow-tpu': '2.20.0'}" in out, out
    assert "GATE True found tensorflow 2.20.0" in out, out
    assert "STRATEGY 1" in out, out
