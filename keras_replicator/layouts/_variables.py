"""The `tf.Variable` a Keras variable holds on the mesh: a DTensor `DVariable`.

Inside a step the variable is DTensor's own: its layout decides what each
device stores and the SPMD expansion adds the collectives. In eager code it
behaves like a whole variable, which is what Keras' saving, `get_weights`,
`set_weights` and `load_weights` need: `numpy()` and every eager read gather
the shards (a relayout to replicated), and `assign` of a whole value, from any file or
model, cuts it into this variable's layout. That is how a `.keras` file saved on
one mesh loads on one device or on another mesh shape.

A new variable's value is made whole on the host device by Keras' own
initializer, then laid out, one variable at a time: its random numbers equal
one device's, at the cost of one whole variable in host memory while it is cut.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor


def lay_out(value, layout: dtensor.Layout, dtype=None):
    """`value` (whole, or a DTensor in any layout) as a DTensor in `layout`."""
    if not isinstance(value, tf.Tensor) or not dtensor.is_dtensor(value):
        value = tf.convert_to_tensor(value, dtype=dtype)
        rank = len(value.shape)
        value = dtensor.copy_to_mesh(
            value, dtensor.Layout.replicated(layout.mesh, rank)
        )
    elif dtype is not None and value.dtype != dtype:
        value = tf.cast(value, dtype)
    if dtensor.fetch_layout(value) == layout:
        return value
    return dtensor.relayout(value, layout)


def gathered(value, mesh: dtensor.Mesh | None = None) -> tf.Tensor:
    """A DTensor made whole (replicated), so that `.numpy()` can read it.

    In a traced function (where layouts cannot be read) every tensor is taken
    to be on `mesh` and relaid out; eagerly, only a split one is.
    """
    if not tf.executing_eagerly():
        rank = len(value.shape)
        return dtensor.relayout(value, dtensor.Layout.replicated(mesh, rank))
    layout = dtensor.fetch_layout(value)
    if layout.is_fully_replicated():
        return value
    return dtensor.relayout(value, dtensor.Layout.replicated(layout.mesh, layout.rank))


class LaidOutVariable(dtensor.DVariable):
    """A `DVariable` that reads and is assigned whole in eager code.

    Example:
    >>> import keras, keras_replicator as kr, tensorflow as tf
    >>> from tensorflow.experimental import dtensor
    >>> from keras_replicator.layouts._mesh import backend_mesh
    >>> device_mesh = keras.distribution.DeviceMesh((2,), ["model"], kr.devices(2))
    >>> mesh = backend_mesh(device_mesh)
    >>> layout = dtensor.Layout(["model"], mesh)
    >>> variable = LaidOutVariable(lay_out(tf.range(4.0), layout))
    >>> variable.numpy().tolist()
    [0.0, 1.0, 2.0, 3.0]
    """

    def numpy(self):
        return self.read_value().numpy()  # an eager read is whole (below)

    def shards(self) -> list[tf.Tensor]:
        """What each local device stores: the variable's shards, as they lie."""
        return dtensor.unpack(super().read_value())

    # An eager read is whole (gathered), so whatever eager code computes from
    # it is whole too. Keras' saving does arithmetic on weights before reading
    # them (a LoRA `EinsumDense` saves `kernel + lora_a @ lora_b`), and with
    # several workers a split result cannot be read at all ("Trying to copy a
    # non-single-device and non-replicated DTensor is not supported"). A read
    # in a traced step keeps the variable's layout.
    def value(self):
        return self._whole_when_eager(super().value())

    def read_value(self):
        return self._whole_when_eager(super().read_value())

    def _whole_when_eager(self, value):
        return gathered(value) if tf.executing_eagerly() else value

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def assign(self, value, use_locking=None, name=None, read_value=True):
        return super().assign(self._laid_out(value), use_locking, name, read_value)

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):
        return super().assign_add(self._laid_out(delta), use_locking, name, read_value)

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
        return super().assign_sub(self._laid_out(delta), use_locking, name, read_value)

    # DTensor cannot expand the resource scatter ops ("'tf.ResourceScatterSub'
    # op does not implement layout propagation"), which Keras' optimizers use
    # for an embedding's `IndexedSlices` gradient: the rows are summed into a
    # whole-shaped update and applied densely (a dense step, same numbers).
    def scatter_add(self, sparse_delta, use_locking=False, name=None):
        return self.assign_add(dense_rows(sparse_delta, self.shape))

    def scatter_sub(self, sparse_delta, use_locking=False, name=None):
        return self.assign_sub(dense_rows(sparse_delta, self.shape))

    def scatter_update(self, sparse_delta, use_locking=False, name=None):
        rows = tf.expand_dims(sparse_delta.indices, -1)
        return self.assign(
            tf.tensor_scatter_nd_update(self.read_value(), rows, sparse_delta.values)
        )

    def _laid_out(self, value):
        # In a traced step every value is already on the mesh, but maybe in
        # another layout: a bias gradient comes split over "model" where the
        # bias is replicated. DTensor's resource update writes each device's
        # shard of the value into that device's copy as is (without this relayout
        # Adam's first step left a replicated bias 0.01, its learning rate, away
        # from one device's), so the value is laid out as the variable first.
        if not tf.executing_eagerly():
            value = tf.convert_to_tensor(value, dtype=self.dtype)
            return dtensor.relayout(value, self.layout)
        if isinstance(value, np.ndarray) or not isinstance(value, tf.Tensor):
            value = tf.convert_to_tensor(value, dtype=self.dtype)
        return lay_out(value, self.layout, self.dtype)


def dense_rows(sparse_delta, shape) -> tf.Tensor:
    """An `IndexedSlices` as the dense tensor of `shape` it adds up to.

    TensorFlow's own conversion: gathering the rows onto every device first
    (a relayout to replicated before the segment sum) lost the whole update of
    an Adam step on an embedding model (no weight moved).
    """
    whole = tf.IndexedSlices(
        sparse_delta.values, sparse_delta.indices, tf.constant(shape.as_list())
    )
    return tf.convert_to_tensor(whole)


def make_variable(value, kwargs, layout: dtensor.Layout) -> LaidOutVariable:
    """A `LaidOutVariable` of the whole `value` in `layout`, with the other
    keyword arguments `tf.Variable` was given."""
    with tf.init_scope():
        value = lay_out(value, layout, kwargs.get("dtype"))
    return LaidOutVariable(
        value,
        trainable=kwargs.get("trainable"),
        name=kwargs.get("name"),
        aggregation=kwargs.get("aggregation") or tf.VariableAggregation.NONE,
        synchronization=kwargs.get("synchronization")
        or tf.VariableSynchronization.AUTO,
        distribute_strategy=kwargs.get("distribute_strategy"),
    )
