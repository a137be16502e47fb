"""The supported-version gate: one range, checked when a strategy is created."""

import pathlib
import subprocess
import sys
import textwrap

import pytest

from keras_replicator import _compat
from keras_replicator._compat import _versions

OLD = {"tensorflow": "2.15.0", "keras": "3.0.5"}


def test_the_running_pair_is_supported():
    report = _versions.report()
    assert report.ok, report.describe()


def test_an_unsupported_pair_fails_naming_both_versions_the_range_and_the_fix():
    with pytest.raises(_versions.UnsupportedVersionError) as error:
        _versions.check_versions(_compat.check_upstream, environ={}, found=OLD)
    message = str(error.value)
    for text in (
        "tensorflow 2.15.0",
        "keras 3.0.5",
        f"keras{_compat.SUPPORTED_VERSIONS['keras']}",
        f"tensorflow{_compat.SUPPORTED_VERSIONS['tensorflow']}",
        "pip install",
        "KERAS_REPLICATOR_ALLOW_UNSUPPORTED=1",
    ):
        assert text in message


def test_one_version_out_of_range_is_enough():
    found = {**_versions.VERIFIED_PAIRS["newest"], "keras": "3.99.0"}
    assert _versions.report(found).unsupported == ("keras",)


def test_the_variable_downgrades_to_a_warning_listing_what_changed(monkeypatch):
    import keras

    def on_epoch_begin(self, epoch, logs=None):  # an upstream change we would miss
        return None

    monkeypatch.setattr(
        keras.callbacks.BackupAndRestore, "on_epoch_begin", on_epoch_begin
    )
    environ = {_versions.ALLOW_UNSUPPORTED: "1"}
    with pytest.warns(RuntimeWarning) as caught:
        report = _versions.check_versions(
            _compat.check_upstream, environ=environ, found=OLD
        )
    assert not report.ok
    message = str(caught[0].message)
    assert "keras 3.0.5" in message
    assert "BackupAndRestore.on_epoch_begin: source digest" in message


def test_the_variable_needs_the_value_one():
    environ = {_versions.ALLOW_UNSUPPORTED: "yes"}
    with pytest.raises(_versions.UnsupportedVersionError):
        _versions.check_versions(_compat.check_upstream, environ=environ, found=OLD)


def test_pyproject_declares_the_supported_range():
    tomllib = pytest.importorskip("tomllib")
    root = pathlib.Path(__file__).parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    dependencies = {d.replace(" ", "") for d in project["dependencies"]}
    keras_spec = _compat.SUPPORTED_VERSIONS["keras"]
    assert f"keras{keras_spec}" in dependencies, dependencies
    assert not [d for d in dependencies if "==" in d], "runtime pins: use ranges"
    # TensorFlow only through one extra per build: never over a TPU build.
    names = {d.split(">")[0].split("<")[0].split("[")[0] for d in dependencies}
    assert not names & {"tensorflow", "tensorflow-cpu", "tensorflow-tpu"}, names
    extras = project["optional-dependencies"]
    tensorflow_spec = _compat.SUPPORTED_VERSIONS["tensorflow"]
    for extra, requirement in _versions.TENSORFLOW_EXTRAS.items():
        assert f"{requirement}{tensorflow_spec}" in extras[extra], extras[extra]


def test_the_dev_constraints_pin_the_newest_verified_pair():
    root = pathlib.Path(__file__).parents[2]
    pins = (root / "constraints" / "dev.txt").read_text().split()
    for name, version in _versions.VERIFIED_PAIRS["newest"].items():
        assert f"{name}=={version}" in pins


GATE = textwrap.dedent(
    """
    import os, warnings
    os.environ.pop("KERAS_REPLICATOR_ALLOW_UNSUPPORTED", None)
    import keras
    keras.__version__ = "3.10.0"  # what an older Colab image would run
    import keras_replicator as kr
    try:
        kr.MultiDeviceReplicator(num_replicas=2)
    except RuntimeError as error:
        print("REFUSED", type(error).__name__, error)
    os.environ["KERAS_REPLICATOR_ALLOW_UNSUPPORTED"] = "1"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy = kr.MultiDeviceReplicator(num_replicas=2)
    print("STARTED", strategy.num_replicas_in_sync)
    print("WARNED", [str(w.message) for w in caught if "3.10.0" in str(w.message)])
    """
)


def test_a_strategy_refuses_an_unsupported_keras_unless_allowed():
    out = subprocess.run(
        [sys.executable, "-c", GATE], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED UnsupportedVersionError" in out.stdout, out.stdout
    assert "found tensorflow" in out.stdout and "keras 3.10.0" in out.stdout
    assert "STARTED 2" in out.stdout
    assert "Upstream check: " in out.stdout  # its content depends on the Keras


MOVED = textwrap.dedent(
    """
    import sys
    import keras
    keras.__version__ = "3.99.0"  # a release that moved a private module
    import keras.src.layers.normalization
    del keras.src.layers.normalization.batch_normalization  # `from ... import` fails
    sys.modules["keras.src.layers.normalization.batch_normalization"] = None
    import keras_replicator as kr
    try:
        kr.MultiDeviceReplicator(num_replicas=2)
    except RuntimeError as error:
        print("REFUSED", type(error).__name__, error)
    from keras_replicator import cli
    print("ENV EXIT", cli.main(["env"]))
    """
)


def test_a_keras_whose_internals_moved_gets_the_range_message_not_an_import_error():
    # The patch modules import Keras' private modules when `_compat` is imported:
    # the version message must come before (review of issue 35).
    out = subprocess.run(
        [sys.executable, "-c", MOVED], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED UnsupportedVersionError" in out.stdout, out.stdout
    assert "could not find the Keras / TensorFlow internals" in out.stdout
    assert "keras 3.99.0" in out.stdout and "not supported" in out.stdout
    assert "ENV EXIT 1" in out.stdout
