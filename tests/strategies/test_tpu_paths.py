"""The TPU flavour of our step, built and audited on CPU (issue 48).

A TPU step is one XLA program: no float64 on the chip, no Python callbacks, no
dynamic shapes. Our TPU-specific decisions key off `_platform.platform_of`, so a
`MultiDeviceReplicator` whose recorded platform is "TPU" builds the step a
`TPUReplicator` would, and its graph can be checked here.
"""

import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator import _platform
from keras_replicator._replicator_state import replicator_state
from keras_replicator.communication import _gradient_form
from keras_replicator.strategies import _auto, tpu

# What XLA cannot compile for a TPU: host callbacks and data-dependent shapes.
FORBIDDEN_OPS = {"PyFunc", "EagerPyFunc", "NumpyFunction", "Unique", "UniqueV2"}


def _tpu_flavoured(num_replicas=2):
    strategy = kr.MultiDeviceReplicator(num_replicas=num_replicas)
    replicator_state(strategy).platform = _platform.TPU
    assert _platform.platform_of(strategy) == _platform.TPU
    return strategy


def _nodes(graph):
    """`(op type, attrs, name)` of every op in `graph` and every function it calls."""
    for op in graph.get_operations():
        yield op.type, op.node_def.attr, op.name
    for function in graph._functions.values():
        definition = function.cached_definition
        for node in definition.node_def:
            yield node.op, node.attr, f"{definition.signature.name}/{node.name}"


def _audit(graph):
    """The ops a TPU step must not have, and those with a float64 attribute."""
    forbidden, float64 = [], []
    for op_type, attrs, name in _nodes(graph):
        if op_type in FORBIDDEN_OPS:
            forbidden.append((op_type, name))
        if any("DT_DOUBLE" in str(value) for value in attrs.values()):
            float64.append((op_type, name))
    return forbidden, float64


def _embedding_model():
    inputs = keras.Input((4,), dtype="int32")
    x = keras.layers.Embedding(50, 8)(inputs)
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    return model


@pytest.mark.parametrize("num_replicas", [2, 1])
def test_the_tpu_step_has_no_float64_python_callbacks_or_unique(
    monkeypatch, num_replicas
):
    # Every table takes the path a large one takes on CPU / GPU (sparse rows).
    monkeypatch.setattr(_gradient_form, "DENSE_MAX_BYTES", 0)
    strategy = _tpu_flavoured(num_replicas)
    with strategy.scope():
        model = _embedding_model()
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, (8, 4)).astype("int32")
    y = rng.normal(size=(8, 1)).astype("float32")
    # One real step: the forward / backward pass runs under XLA on CPU.
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    iterator = iter(strategy.experimental_distribute_dataset(batches))
    step = tf.function(model.train_function, autograph=False)
    graph = step.get_concrete_function(iterator).graph
    forbidden, float64 = _audit(graph)
    assert "CollectiveReduceV2" in {t for t, _, _ in _nodes(graph)} or (
        num_replicas == 1
    )
    assert not forbidden and not float64, (forbidden, float64)


def test_repeated_rows_are_summed_under_xla_on_a_tpu():
    @tf.function(jit_compile=True)
    def summed_rows(values, indices):
        slices = tf.IndexedSlices(values, indices, tf.constant([5, 1]))
        return _gradient_form.sum_repeated_rows(slices)

    with _tpu_flavoured().scope():
        summed = summed_rows(tf.constant([[1.0], [2.0], [4.0]]), tf.constant([3, 0, 3]))
    assert summed.indices.numpy().tolist() == [0, 1, 2, 3, 4]
    assert summed.values.numpy().ravel().tolist() == [2.0, 0.0, 0.0, 5.0, 0.0]


def test_an_embedding_gradient_is_dense_on_a_tpu(monkeypatch):
    monkeypatch.setattr(_gradient_form, "DENSE_MAX_BYTES", 0)
    variable = tf.Variable(tf.zeros([5, 1]))
    slices = tf.IndexedSlices(tf.ones([2, 1]), tf.constant([1, 1]), tf.constant([5, 1]))
    assert isinstance(_gradient_form.shaped_like(slices, variable), tf.IndexedSlices)
    with _tpu_flavoured().scope():
        dense = _gradient_form.shaped_like(slices, variable)
    assert isinstance(dense, tf.Tensor)
    assert dense.numpy().ravel().tolist() == [0.0, 2.0, 0.0, 0.0, 0.0]


def _vfio_only(monkeypatch):
    """This host looks like a TPU v5e / v6e VM: /dev/vfio/0, no /dev/accel0."""
    exists = os.path.exists
    monkeypatch.setattr(
        os.path,
        "exists",
        lambda path: path == "/dev/vfio/0" or (path != "/dev/accel0" and exists(path)),
    )


@pytest.mark.slow(
    reason="covered in the default run by: "
    "test_auto_falls_back_with_a_warning_when_the_tpu_cannot_start (the same "
    "/dev/vfio/0 hint, and connect_tpu's NotFoundError named in its warning)"
)
def test_a_vfio_device_is_a_local_tpu_vm(clean_tf_config, monkeypatch):
    _vfio_only(monkeypatch)
    assert tpu.tpu_environment_hint() == "TPU device files exist (/dev/vfio/0)"
    # tpu="local": TensorFlow looks for the TPU on this host (and finds none
    # here), without asking a cloud metadata server for a TPU named by TPU_NAME.
    with pytest.raises(tf.errors.NotFoundError, match="TPUs not found"):
        tpu.connect_tpu()


def test_auto_falls_back_with_a_warning_when_the_tpu_cannot_start(
    clean_tf_config, monkeypatch
):
    _vfio_only(monkeypatch)
    with pytest.warns(RuntimeWarning) as caught:
        strategy = kr.auto(num_replicas=2, verbose=False)
    assert isinstance(strategy, kr.MultiDeviceReplicator)
    assert strategy.num_replicas_in_sync == 2
    message = str(caught[0].message)
    for text in ("/dev/vfio/0", "NotFoundError", "keras-replicator[tpu]", "Falling"):
        assert text in message, message
    assert "the TPU could not be initialised" in strategy.selection_reason


def test_auto_without_a_tpu_hint_does_not_warn(clean_tf_config):
    if tpu.tpu_environment_hint():
        pytest.skip("this machine shows a TPU")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert _auto._tpu_or_none(None, 2) == (None, None)
