"""Which TensorFlow build is installed: found by metadata, one at a time (issue 48)."""

import importlib.metadata
import pathlib
import subprocess
import sys
import textwrap

import packaging
import pytest

from keras_replicator._compat import _versions

ROOT = pathlib.Path(__file__).parents[2]


def _distribution(site, name, version, top_level=None, files=()):
    """A dist-info folder as pip writes it (METADATA, top_level.txt, RECORD)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    if top_level is not None:
        (info / "top_level.txt").write_text(top_level + "\n")
    record = [*files, f"{info.name}/METADATA"]
    (info / "RECORD").write_text("".join(f"{line},,\n" for line in record))


def _installed(site):
    return list(importlib.metadata.distributions(path=[str(site)]))


def test_the_tensorflow_distribution_is_found_whatever_its_name(tmp_path):
    # As tensorflow-tpu's wheel spells its name.
    _distribution(tmp_path, "tensorflow_tpu", "2.20.0", top_level="tensorflow")
    # tf-nightly's wheels may come without top_level.txt: its files say it.
    _distribution(
        tmp_path,
        "tf-nightly",
        "2.22.0.dev20260101",
        files=["tensorflow/__init__.py", "tensorflow/python/__init__.py"],
    )
    _distribution(tmp_path, "keras", "3.15.1", top_level="keras")
    _distribution(tmp_path, "tensorboard", "2.20.0", top_level="tensorboard")
    _distribution(
        tmp_path,
        "tensorflow-datasets",
        "4.9.10",
        files=["tensorflow_datasets/__init__.py"],
    )
    found = _versions.tensorflow_distributions(_installed(tmp_path))
    assert found == {"tensorflow-tpu": "2.20.0", "tf-nightly": "2.22.0.dev20260101"}


def test_the_running_build_is_found():
    found = _versions.tensorflow_distributions()
    import tensorflow as tf

    assert tf.__version__ in found.values(), found


def test_two_tensorflow_builds_warn_naming_both_and_the_fix(tmp_path):
    # `pip install tensorflow` on a TPU VM: the CPU build over the TPU one.
    _distribution(tmp_path, "tensorflow-tpu", "2.20.0", top_level="tensorflow")
    _distribution(tmp_path, "tensorflow", "2.21.0", top_level="tensorflow")
    with pytest.warns(RuntimeWarning) as caught:
        _versions.check_one_tensorflow(_installed(tmp_path))
    message = str(caught[0].message)
    for text in (
        "tensorflow 2.21.0",
        "tensorflow-tpu 2.20.0",
        "pip uninstall tensorflow tensorflow-tpu",
        'pip install "keras-replicator[tpu]"',
    ):
        assert text in message, message


def test_one_build_does_not_warn(tmp_path, recwarn):
    _distribution(tmp_path, "tensorflow-tpu", "2.20.0", top_level="tensorflow")
    assert _versions.check_one_tensorflow(_installed(tmp_path)) == {
        "tensorflow-tpu": "2.20.0"
    }
    assert not [w for w in recwarn if w.category is RuntimeWarning]


# A Python with keras_replicator and its `packaging`, and no TensorFlow.
NO_TENSORFLOW = textwrap.dedent(
    """
    import sys
    sys.path[:0] = [{root!r}, {packaging!r}]
    try:
        import keras_replicator._compat
    except ImportError as error:
        print("REFUSED", type(error).__name__, error)
    """
)


def test_no_tensorflow_build_names_the_extras_to_install(tmp_path):
    # `packaging` alone: its site-packages would bring TensorFlow along.
    (tmp_path / "packaging").symlink_to(pathlib.Path(packaging.__file__).parent)
    script = NO_TENSORFLOW.format(root=str(ROOT), packaging=str(tmp_path))
    # -S: no site-packages, so neither TensorFlow nor Keras is importable.
    out = subprocess.run(
        [sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED TensorFlowMissingError" in out.stdout, out.stdout
    for extra in ("[tpu]", "[and-cuda]", "[tensorflow]"):
        assert f'pip install "keras-replicator{extra}"' in out.stdout, out.stdout
