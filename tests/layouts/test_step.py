"""Why predictions reach losses split over the batch only: DTensor's sparse
cross-entropy is wrong when the class dimension is split. The first test pins
that upstream behaviour; when it fails, TensorFlow fixed it and
`layouts/_step.py`'s relayout of predictions can go.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

import keras_replicator as kr
from keras_replicator.layouts._mesh import backend_mesh
from keras_replicator.layouts._step import split_by_batch_only
from keras_replicator.layouts._variables import gathered, lay_out


@pytest.fixture
def mesh():
    device_mesh = keras.distribution.DeviceMesh(
        (2, 2), ["batch", "model"], kr.devices(4)
    )
    return backend_mesh(device_mesh)


def logits_and_labels():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 6, 32)), rng.integers(0, 32, (8, 6))


def test_dtensor_sparse_cross_entropy_is_wrong_on_split_classes(mesh):
    logits, labels = logits_and_labels()
    expected = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits).numpy()
    split = lay_out(logits, dtensor.Layout(["batch", "unsharded", "model"], mesh))
    labels = lay_out(labels, dtensor.Layout(["batch", "unsharded"], mesh))
    with dtensor.default_mesh(mesh):
        got = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, split)
    # Off by more than 1 (or NaN) where one device's values are about 4.
    assert not np.allclose(gathered(got).numpy(), expected, atol=1.0)


def test_relaid_out_predictions_give_one_devices_loss(mesh):
    logits, labels = logits_and_labels()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    expected = float(loss(labels, logits))
    split = lay_out(logits, dtensor.Layout(["batch", "unsharded", "model"], mesh))
    labels = lay_out(labels, dtensor.Layout(["batch", "unsharded"], mesh))

    @tf.function
    def step(labels, logits):
        logits = split_by_batch_only(logits, mesh, "batch")
        return gathered(loss(labels, logits), mesh)

    with dtensor.default_mesh(mesh):
        got = float(step(labels, split).numpy())
    assert got == pytest.approx(expected, abs=1e-12)
