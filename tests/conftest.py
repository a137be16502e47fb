"""Test session setup: 4 logical CPU devices, made before TensorFlow starts.

Every in-process test shares them: strategies with 1, 2 or 4 replicas use the first
devices. Multi-worker tests start their own worker processes.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

# Which tests `make test` leaves to `make test-slow` is said on each test:
# `@pytest.mark.slow(reason="covered in the default run by: <test>")` (or
# `pytestmark`, or `pytest.param(..., marks=...)` for one case). A slow variant
# names the default-run test that checks the same thing (issues 34, 50).


# TensorFlow's DTensor (kr.ModelParallelReplicator) and tf.distribute's
# collectives take collective group keys from the same space in one process:
# after one has run, the other fails ("Device CPU:0 is joining a group that is
# already full (group_key=1)") and every later collective in the process with it.
# So the DTensor tests run in a pytest process of their own
# (tests/test_dtensor_process.py starts it with this variable set), and only there.
DTENSOR_PROCESS = "KR_DTENSOR_TEST_PROCESS"
DTENSOR_PATHS = ("layouts", "strategies/test_model_parallel.py")
_TESTS = os.path.dirname(os.path.abspath(__file__))


def in_dtensor_process() -> bool:
    return os.environ.get(DTENSOR_PROCESS) == "1"


def pytest_ignore_collect(collection_path, config):
    # The DTensor process is given its paths (and those only) on its command line.
    if in_dtensor_process():
        return None
    relative = os.path.relpath(str(collection_path), _TESTS)
    if any(relative == p or relative.startswith(p + os.sep) for p in DTENSOR_PATHS):
        return True
    return None


def pytest_configure(config):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if not tf.config.get_logical_device_configuration(cpu):
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 4
        )


@pytest.fixture
def float64():
    """Keras' float type and dtype policy set to float64 for one test."""
    import keras

    floatx, policy = keras.backend.floatx(), keras.config.dtype_policy()
    keras.backend.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    yield
    keras.backend.set_floatx(floatx)
    keras.config.set_dtype_policy(policy)


@pytest.fixture
def clean_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    for name in ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE"):
        monkeypatch.delenv(name, raising=False)
