"""Local replica devices on GPU machines, proved on a CPU with a faked device list.

The fakes stand at TensorFlow's boundary only: `tf.config` reports the fake
GPUs as visible and records the logical-device configuration asked of them (and
refuses, as TensorFlow does, a change once "initialised" or a GPU logical device
without a memory limit); everything between is the library's code.
"""

import shutil
import subprocess

import pytest
import tensorflow as tf

from keras_replicator.strategies import _devices


class _FakeGPUs:
    def __init__(self, monkeypatch, count, *, initialised=False, split=None):
        self.gpus = [
            tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU")
            for i in range(count)
        ]
        self.initialised = initialised
        self.configs = {}
        if split:
            memory = tf.config.LogicalDeviceConfiguration(memory_limit=512)
            self.configs = {gpu: [memory] * split for gpu in self.gpus}
        self.asked = []
        visible = tf.config.get_visible_devices
        get_config = tf.config.get_logical_device_configuration
        monkeypatch.setattr(
            tf.config,
            "get_visible_devices",
            lambda kind=None: list(self.gpus) if kind == "GPU" else visible(kind),
        )
        monkeypatch.setattr(
            tf.config,
            "get_logical_device_configuration",
            lambda dev: self.configs.get(dev) if dev in self.gpus else get_config(dev),
        )
        monkeypatch.setattr(tf.config, "set_logical_device_configuration", self._set)
        monkeypatch.setattr(tf.config, "list_logical_devices", self._logical)
        monkeypatch.delenv(_devices.GPU_MEMORY_ENV, raising=False)
        monkeypatch.setattr(shutil, "which", lambda name: None)

    def _set(self, device, config):
        assert device in self.gpus, "only the fake GPUs may be configured here"
        if any(c.memory_limit is None for c in config):
            raise ValueError("Setting memory limit is required for GPU virtual devices")
        if self.initialised and self.configs.get(device) != config:
            raise RuntimeError("Virtual devices cannot be modified after initialized")
        self.asked.append((device, list(config)))
        self.configs[device] = list(config)

    def _logical(self, kind=None):
        count = sum(len(self.configs.get(gpu) or [None]) for gpu in self.gpus)
        return [
            tf.config.LogicalDevice(f"/device:GPU:{i}", "GPU") for i in range(count)
        ]


def _limits(config):
    return [c.memory_limit for c in config]


@pytest.mark.parametrize("replicas", [2, 4])  # `make demo`; large_batch_resnet
def test_more_replicas_than_one_gpu_split_it_with_a_warning(monkeypatch, replicas):
    fake = _FakeGPUs(monkeypatch, 1)
    with pytest.warns(UserWarning, match="share the GPU") as warned:
        devices = _devices.local_replica_devices(replicas)
    assert devices == [f"/gpu:{i}" for i in range(replicas)]
    [(gpu, config)] = fake.asked
    assert _limits(config) == [_devices.FALLBACK_GPU_MEMORY_MB] * replicas
    message = str(warned[0].message)
    assert "no speed-up" in message and _devices.GPU_MEMORY_ENV in message


def test_several_gpus_are_each_split_evenly(monkeypatch):
    fake = _FakeGPUs(monkeypatch, 2)
    with pytest.warns(UserWarning, match="split into 2 logical GPUs"):
        devices = _devices.local_replica_devices(4)
    assert devices == ["/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"]
    assert [(gpu, len(config)) for gpu, config in fake.asked] == [
        (fake.gpus[0], 2),
        (fake.gpus[1], 2),
    ]


def test_a_replica_count_the_gpus_do_not_divide_is_an_error(monkeypatch):
    fake = _FakeGPUs(monkeypatch, 2)
    with pytest.raises(ValueError, match="multiple of 2") as error:
        _devices.local_replica_devices(3)
    assert "num_replicas=3 with 2 GPUs" in str(error.value)
    assert "Pass num_replicas=2 or 4" in str(error.value)
    assert fake.asked == []


def test_memory_limit_from_the_environment(monkeypatch):
    fake = _FakeGPUs(monkeypatch, 1)
    monkeypatch.setenv(_devices.GPU_MEMORY_ENV, "3000")
    with pytest.warns(UserWarning, match="3000 MB"):
        _devices.local_replica_devices(2)
    assert _limits(fake.asked[0][1]) == [3000, 3000]


def test_memory_limit_shares_the_smallest_free_memory_nvidia_smi_reports(monkeypatch):
    fake = _FakeGPUs(monkeypatch, 1)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    asked = []

    def run(command, **kwargs):
        asked.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="16384\n15360\n")

    monkeypatch.setattr(subprocess, "run", run)
    with pytest.warns(UserWarning):
        _devices.local_replica_devices(4)
    assert _limits(fake.asked[0][1]) == [int(15360 * 0.9) // 4] * 4
    assert "--query-gpu=memory.free" in asked[0]


def test_a_bad_memory_variable_is_an_error(monkeypatch):
    _FakeGPUs(monkeypatch, 1)
    monkeypatch.setenv(_devices.GPU_MEMORY_ENV, "2GB")
    with pytest.raises(
        ValueError, match="Received: KERAS_REPLICATOR_GPU_MEMORY_MB='2GB'"
    ):
        _devices.local_replica_devices(2)


def test_an_existing_split_is_reused_after_tf_started(monkeypatch):
    fake = _FakeGPUs(monkeypatch, 1, initialised=True, split=4)
    assert _devices.local_replica_devices(2) == ["/gpu:0", "/gpu:1"]
    assert _devices.local_replica_devices() == [f"/gpu:{i}" for i in range(4)]
    assert fake.asked == []


def test_a_split_too_small_after_tf_started_is_a_clear_error(monkeypatch):
    _FakeGPUs(monkeypatch, 1, initialised=True)
    with pytest.raises(ValueError, match="logical GPUs cannot be made") as error:
        _devices.local_replica_devices(2)
    assert "already initialised" in str(error.value)
    assert "num_replicas<=1" in str(error.value)


def test_fewer_replicas_than_logical_gpus_spread_over_the_physical_gpus(monkeypatch):
    _FakeGPUs(monkeypatch, 2, initialised=True, split=2)  # GPU:0,1 | GPU:2,3
    assert _devices.local_replica_devices(2) == ["/gpu:0", "/gpu:2"]
    assert _devices.local_replica_devices(3) == ["/gpu:0", "/gpu:1", "/gpu:2"]


def test_one_replica_per_gpu_needs_no_split(monkeypatch):
    fake = _FakeGPUs(monkeypatch, 2)
    assert _devices.local_replica_devices(2) == ["/gpu:0", "/gpu:1"]
    assert _devices.local_replica_devices() == ["/gpu:0", "/gpu:1"]
    assert fake.asked == []


def test_hidden_gpus_are_not_used(monkeypatch):
    # `tf.config.set_visible_devices([], "GPU")` hides a GPU the machine has.
    gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
    physical = tf.config.list_physical_devices
    monkeypatch.setattr(
        tf.config,
        "list_physical_devices",
        lambda kind=None: [gpu] if kind == "GPU" else physical(kind),
    )
    assert _devices.local_replica_devices(2) == ["/cpu:0", "/cpu:1"]
