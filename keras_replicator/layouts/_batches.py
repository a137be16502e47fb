"""A dataset's batches as DTensors split over the mesh's batch axis."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.experimental import dtensor

from keras_replicator.layouts._variables import lay_out


def batch_layout(tensor, mesh: dtensor.Mesh, batch_axis: str) -> dtensor.Layout:
    """Split over `batch_axis` along the first dimension, when it divides it.

    A batch the axis does not divide (Keras' last, smaller batch) is
    replicated instead: every device then computes on the whole batch, which
    costs time on one batch an epoch but gives the same numbers.

    Example:
    >>> import keras, keras_replicator as kr, tensorflow as tf
    >>> from keras_replicator.layouts._mesh import backend_mesh
    >>> device_mesh = keras.distribution.DeviceMesh((2,), ["batch"], kr.devices(2))
    >>> mesh = backend_mesh(device_mesh)
    >>> batch_layout(tf.zeros([4, 3]), mesh, "batch").sharding_specs
    ['batch', 'unsharded']
    >>> batch_layout(tf.zeros([3, 3]), mesh, "batch").sharding_specs
    ['unsharded', 'unsharded']
    """
    rank = len(tensor.shape)
    size = tensor.shape[0] if rank else None
    if not rank or size is None or size % mesh.dim_size(batch_axis):
        return dtensor.Layout.replicated(mesh, rank)
    return dtensor.Layout.batch_sharded(mesh, batch_axis, rank)


def on_mesh(batch, mesh: dtensor.Mesh, batch_axis: str):
    """Every tensor of `batch` (any nest) as a DTensor laid out by `batch_layout`."""

    def place(tensor):
        if tensor is None:
            return None
        if isinstance(tensor, (tf.SparseTensor, tf.RaggedTensor)):
            raise TypeError(
                "`ModelParallelReplicator` takes dense batches only. Received: a "
                f"{type(tensor).__name__} in the dataset's elements. Make it dense "
                "(e.g. `.to_tensor()`) in the dataset."
            )
        return lay_out(tensor, batch_layout(tensor, mesh, batch_axis))

    return tf.nest.map_structure(place, batch)


class MeshBatches:
    """An iterable over a dataset whose iterators yield `on_mesh` batches.

    Its iterators are plain Python iterators, not `tf.data.Iterator`s, so Keras'
    trainer runs its one-step function once per batch (its `steps_per_execution`
    loop in Python) rather than its `tf.while_loop` over an iterator.
    """

    def __init__(self, dataset: tf.data.Dataset, mesh: dtensor.Mesh, batch_axis: str):
        self._dataset = dataset
        self._mesh = mesh
        self._batch_axis = batch_axis

    @property
    def element_spec(self):
        return self._dataset.element_spec

    def __iter__(self):
        for batch in self._dataset:
            yield on_mesh(batch, self._mesh, self._batch_axis)
