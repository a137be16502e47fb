"""One replica per worker on a GPU: its plain feed is prefetched to its device.

TF's distributed iterator copies each batch to the replica's device ahead of the
step; the plain feed (issue 36) must too, or every step starts with a synchronous
host -> GPU copy (issue 48, item 12). Proved on CPU: the GPU flavour is built with
GPU device strings in a `tf.Graph` (nothing runs), and run with the platform set
to GPU on a CPU replica.
"""

import contextlib

import keras
import numpy as np
import tensorflow as tf

import keras_replicator as kr
from keras_replicator._replicator_state import replicator_state
from keras_replicator.keras_integration import _fit_input


def _new_dataset_ops(build):
    """(type, device) of the tf.data ops `build(dataset)` adds to a fresh graph."""
    with tf.Graph().as_default() as graph:
        data = tf.data.Dataset.range(8).batch(2)
        before = {op.name for op in graph.get_operations()}
        fed = build(data)
        added = [
            (op.type, tf.DeviceSpec.from_string(op.device))
            for op in graph.get_operations()
            if op.name not in before and op.type.endswith("Dataset")
        ]
        return data, fed, added


def _on_gpu0(spec) -> bool:
    return spec.device_type == "GPU" and spec.device_index == 0


def test_one_gpu_replica_is_fed_through_a_prefetch_to_its_gpu():
    strategy = kr.MultiDeviceReplicator(devices=["/gpu:0"])
    data, fed, added = _new_dataset_ops(
        lambda data: _fit_input.input_for_fit(strategy, data)
    )
    assert fed is not data and fed.element_spec == data.element_spec
    # The copy to the GPU and the buffer after it both live on the replica's GPU.
    types = [kind for kind, spec in added if _on_gpu0(spec)]
    assert types == ["GeneratorDataset", "PrefetchDataset"], added


def test_one_cpu_replica_is_fed_the_dataset_itself():
    strategy = kr.MultiDeviceReplicator(num_replicas=1)
    data, fed, added = _new_dataset_ops(
        lambda data: _fit_input.input_for_fit(strategy, data)
    )
    assert fed is data and not added
    # The same strategy told it runs on a GPU takes the device path.
    replicator_state(strategy).platform = "GPU"
    _, fed, added = _new_dataset_ops(
        lambda data: _fit_input.input_for_fit(strategy, data)
    )
    assert [kind for kind, _ in added] == ["GeneratorDataset", "PrefetchDataset"]


def test_a_gpu_workers_share_of_the_data_is_prefetched_to_its_gpu(monkeypatch):
    # The multi-worker branch (this worker's part of TF's distributed dataset),
    # on one process: the worker-count checks answer as on a cluster.
    strategy = kr.MultiDeviceReplicator(devices=["/gpu:0"])
    monkeypatch.setattr(_fit_input._compat, "in_multi_worker_mode", lambda s: True)
    monkeypatch.setattr(
        _fit_input, "same_batch_count_on_every_worker", lambda *args: True
    )
    _, fed, added = _new_dataset_ops(
        lambda data: _fit_input.input_for_fit(strategy, data)
    )
    assert isinstance(fed, tf.data.Dataset), type(fed)
    assert "AutoShardDataset" in [kind for kind, _ in added]
    assert [kind for kind, spec in added if _on_gpu0(spec)] == [
        "GeneratorDataset",
        "PrefetchDataset",
    ], added


def test_strings_stay_on_the_host_the_gpus_tensors_are_prefetched():
    strategy = kr.MultiDeviceReplicator(devices=["/gpu:0"])

    def with_strings(data):
        return data.map(lambda x: (x, tf.strings.as_string(x)))

    data, fed, added = _new_dataset_ops(
        lambda data: _fit_input.input_for_fit(strategy, with_strings(data))
    )
    assert not [kind for kind, spec in added if _on_gpu0(spec)], added
    _, fed, added = _new_dataset_ops(
        lambda data: _fit_input.input_for_fit(strategy, data.map(lambda x: (x, x)))
    )
    assert [kind for kind, spec in added if _on_gpu0(spec)] == [
        "GeneratorDataset",
        "PrefetchDataset",
    ]


def _fit(strategy):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(96, 5)), rng.normal(size=(96, 1))
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"]


def test_fit_through_the_device_prefetch_trains_as_plain_keras(monkeypatch):
    copied_to = []
    original = tf.data.experimental.copy_to_device

    def recording(target_device, source_device="/cpu:0"):
        copied_to.append((target_device, source_device))
        return original(target_device, source_device)

    monkeypatch.setattr(tf.data.experimental, "copy_to_device", recording)
    strategy = kr.MultiDeviceReplicator(num_replicas=1)
    replicator_state(strategy).platform = "GPU"  # the GPU path, on the CPU device
    weights, loss = _fit(strategy)
    (device,) = strategy.extended.worker_devices
    assert copied_to == [(device, "/job:localhost/replica:0/task:0/device:CPU:0")]
    plain_weights, plain_loss = _fit(None)
    np.testing.assert_allclose(loss, plain_loss, rtol=1e-6)
    for got, want in zip(weights, plain_weights):
        np.testing.assert_allclose(got, want, rtol=1e-6)
