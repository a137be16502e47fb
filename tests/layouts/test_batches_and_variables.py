"""Batches on the mesh, and variables that read and are assigned whole."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

import keras_replicator as kr
from keras_replicator.layouts._batches import MeshBatches, on_mesh
from keras_replicator.layouts._mesh import backend_mesh
from keras_replicator.layouts._variables import LaidOutVariable, gathered, lay_out


@pytest.fixture
def mesh():
    device_mesh = keras.distribution.DeviceMesh(
        (2, 2), ["batch", "model"], kr.devices(4)
    )
    return backend_mesh(device_mesh)


def test_a_batch_is_split_over_the_batch_axis_unless_it_does_not_divide(mesh):
    batch = {"x": tf.zeros([4, 3]), "y": tf.zeros([4]), "w": tf.constant(1.0)}
    placed = on_mesh(batch, mesh, "batch")
    assert dtensor.fetch_layout(placed["x"]).sharding_specs == ["batch", "unsharded"]
    assert dtensor.fetch_layout(placed["y"]).sharding_specs == ["batch"]
    assert dtensor.fetch_layout(placed["w"]).sharding_specs == []
    odd = on_mesh(tf.reshape(tf.range(6.0), [3, 2]), mesh, "batch")
    assert dtensor.fetch_layout(odd).is_fully_replicated()
    np.testing.assert_array_equal(gathered(odd).numpy(), np.arange(6.0).reshape(3, 2))


def test_every_row_of_the_dataset_arrives_once_in_order(mesh):
    dataset = tf.data.Dataset.range(10).batch(4)
    rows = [
        gathered(batch).numpy().tolist()
        for batch in MeshBatches(dataset, mesh, "batch")
    ]
    assert rows == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_sparse_input_is_refused_by_name(mesh):
    sparse = tf.sparse.from_dense(tf.eye(4))
    with pytest.raises(TypeError, match="Received: a SparseTensor"):
        on_mesh(sparse, mesh, "batch")


def test_a_split_variable_reads_whole_and_is_assigned_whole(mesh):
    layout = dtensor.Layout(["unsharded", "model"], mesh)
    variable = LaidOutVariable(lay_out(tf.zeros([2, 4]), layout))
    whole = np.arange(8.0).reshape(2, 4)
    variable.assign(whole)
    np.testing.assert_array_equal(variable.numpy(), whole)
    np.testing.assert_array_equal(np.asarray(variable), whole)
    assert variable.layout == layout
    # An eager read is whole; the shards are what each device stores.
    assert dtensor.fetch_layout(variable.read_value()).is_fully_replicated()
    shards = [s.numpy().tolist() for s in variable.shards()]
    assert shards[0] == [[0.0, 1.0], [4.0, 5.0]]
    assert shards[1] == [[2.0, 3.0], [6.0, 7.0]]
    # A DTensor in another layout is relaid out, not refused.
    variable.assign_add(lay_out(tf.ones([2, 4]), dtensor.Layout.replicated(mesh, 2)))
    np.testing.assert_array_equal(variable.numpy(), whole + 1)
