"""A conformance process's set-up: TF32 off during checks, devices per factory.

GPU machines are faked at TensorFlow's boundary (`tf.config` reports fake GPUs and
records the visible devices asked for); this machine has none, so the GPU
factories must say so rather than run on the CPU.
"""

import dataclasses

import pytest
import tensorflow as tf

from keras_replicator.testing import FACTORIES, _checks
from keras_replicator.testing._factories import get_factory
from keras_replicator.testing._worker import prepare_devices, run_checks_here


class _Built:
    def __init__(self, strategy):
        self.build = lambda: strategy


@pytest.fixture
def tf32_on():
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(True)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(before)


def test_checks_run_with_tf32_off_and_it_is_restored(monkeypatch, tf32_on):
    seen = []

    def probe(strategy):
        seen.append(tf.config.experimental.tensor_float_32_execution_enabled())
        return 0.0, {}

    def failing(strategy):
        seen.append(tf.config.experimental.tensor_float_32_execution_enabled())
        raise AssertionError("differs")

    monkeypatch.setitem(_checks.CHECKS, "probe", (probe, "records TF32"))
    monkeypatch.setitem(_checks.CHECKS, "failing", (failing, "fails"))
    strategy = tf.distribute.get_strategy()
    [passed, failed] = run_checks_here(_Built(strategy), ["probe", "failing"])
    assert passed.passed and not failed.passed
    assert seen == [False, False]
    assert tf.config.experimental.tensor_float_32_execution_enabled()


def test_gpu_factories_are_registered_and_cpu_ones_hide_gpus():
    gpu = {name: f.gpus for name, f in FACTORIES.items() if f.gpus}
    assert gpu == {"split-gpu-2": 1, "multi-gpu": 2, "multi-worker-gpu-2": 2}
    assert get_factory("multi-worker-gpu-2").num_workers == 2
    assert get_factory("multi-device-2").gpus == 0


@pytest.mark.parametrize(
    "name, reason",
    [
        ("split-gpu-2", "not available: needs 1 GPU, this machine has 0"),
        ("multi-gpu", "not available: needs 2 GPUs, this machine has 0"),
    ],
)
def test_gpu_factories_are_not_available_without_gpus(name, reason):
    assert prepare_devices(get_factory(name)) == reason


class _FakeGPUs:
    def __init__(self, monkeypatch, count):
        self.gpus = [
            tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU")
            for i in range(count)
        ]
        self.visible = []
        visible = tf.config.get_visible_devices
        monkeypatch.setattr(
            tf.config,
            "get_visible_devices",
            lambda kind=None: list(self.gpus) if kind == "GPU" else visible(kind),
        )
        monkeypatch.setattr(
            tf.config,
            "set_visible_devices",
            lambda devices, kind=None: self.visible.append((list(devices), kind)),
        )


def test_a_cpu_factory_hides_the_gpus(monkeypatch):
    fake = _FakeGPUs(monkeypatch, 1)
    assert prepare_devices(get_factory("multi-device-4")) is None
    assert fake.visible == [([], "GPU")]


@pytest.mark.parametrize("index, share", [("0", [0, 1]), ("1", [2, 3])])
def test_each_worker_of_a_gpu_factory_gets_its_share(monkeypatch, index, share):
    fake = _FakeGPUs(monkeypatch, 4)
    monkeypatch.setenv("KERAS_REPLICATOR_WORKER_INDEX", index)
    # The session's 4 logical CPUs are fixed; the worker's GPU share is the point.
    factory = dataclasses.replace(get_factory("multi-worker-gpu-2"), logical_cpus=4)
    assert prepare_devices(factory) is None
    assert fake.visible == [([fake.gpus[i] for i in share], "GPU")]
