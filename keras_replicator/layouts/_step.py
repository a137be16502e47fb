"""What a Keras step on the mesh needs beyond DTensor's expansion of its ops.

Two silent errors of DTensor's SPMD expansion, each measured, are kept out of
the step of the model being trained:

Predictions. DTensor's SPMD expansion of `SparseSoftmaxCrossEntropyWithLogits`
is wrong when the class dimension is split: on logits of shape [8, 6, 32] laid
out [batch, -, model] it returned cross-entropies 5.38 away from one device's
(the same logits laid out [batch, -, -]: equal), without an error. A causal
LM's logits come out split over the vocabulary whenever its embedding is
(Gemma's `get_layout_map` splits it over "model"). So `ModelParallelReplicator`
lays the outputs of the model whose step runs out over the batch axis alone:
one all-gather of the logits per step, as Megatron's unsharded loss does, and
numbers equal to one device's for every loss and metric. A custom `train_step`
passing its predictions to a metric itself sees them so too, since the model's
own outputs are relaid out.

Gradients. A gradient comes out of the backward pass as a pending sum over the
batch axis; where the weight (and so its optimizer slots) is split over that
same axis, as when fully sharded, DTensor applied Adam's square to the unsummed
parts: one step put every weight 0.01 (the learning rate) away from one
device's, while SGD, linear, was exact. So the optimizer is handed each
gradient already laid out as its variable (the sum done, then each device keeps
its shard: a reduce-scatter), where the variable is split over the batch axis.
"""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf
from tensorflow.experimental import dtensor

from keras_replicator.layouts._batches import batch_layout
from keras_replicator.layouts._variables import dense_rows


def split_by_batch_only(tree, mesh: dtensor.Mesh, batch_axis: str):
    """Every tensor of `tree` relaid out over `batch_axis` along its first dim.

    Inside a traced step only (DTensor reads layouts eagerly only); laid out
    as a batch is (`_batches.batch_layout`).
    """

    def relayout(tensor):
        if not isinstance(tensor, tf.Tensor) or tf.executing_eagerly():
            return tensor
        return dtensor.relayout(tensor, batch_layout(tensor, mesh, batch_axis))

    return tf.nest.map_structure(relayout, tree)


def laid_out_as_variables(grads, variables, batch_axis: str):
    """Dense gradients; those of variables split over `batch_axis` laid out so.

    Traced steps only. An embedding's `IndexedSlices` gradient is made dense:
    given to Adam as is, the first step moved no weight at all (its slots were
    right); made dense, it matched one device. Only the gradients of variables
    split over `batch_axis` are relaid out: relaying out that of a weight split
    over another axis ("model") put SGD with momentum 0.02 off one device after
    2 steps, while leaving it alone was exact.
    """
    if tf.executing_eagerly():
        return grads
    out = []
    for grad, variable in zip(grads, variables):
        if isinstance(grad, tf.IndexedSlices):
            grad = dense_rows(grad, variable.shape)
        value = getattr(variable, "value", variable)
        layout = getattr(value, "layout", None)
        if (
            isinstance(grad, tf.Tensor)
            and isinstance(layout, dtensor.Layout)
            and batch_axis in layout.sharding_specs
        ):
            grad = dtensor.relayout(grad, layout)
        out.append(grad)
    return out


@contextlib.contextmanager
def mesh_step(model, mesh: dtensor.Mesh, batch_axis: str):
    """While tracing `model`'s step: batch-split outputs, laid-out gradients.

    Wraps two public methods of the instance, removed on exit: `call` (what
    Keras' `Layer.__call__` runs), so every use of the predictions sees them
    split over the batch only (Keras' `compute_loss` and `compute_metrics`, a
    custom `train_step`'s own `metric.update_state(y, y_pred)`); and its
    optimizer's `apply` (which `apply_gradients` calls), so the gradients reach
    the update laid out as their variables. Anything else than a compiled
    `keras.Model` is left alone.
    """
    if not isinstance(model, keras.Model):
        yield
        return
    wrapped = []
    original_call = model.call

    def call(*args, **kwargs):
        return split_by_batch_only(original_call(*args, **kwargs), mesh, batch_axis)

    object.__setattr__(model, "call", call)
    wrapped.append((model, "call"))
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        original_apply = optimizer.apply

        def apply(grads, trainable_variables=None):
            if trainable_variables is None:
                return original_apply(grads)
            grads = laid_out_as_variables(
                list(grads), list(trainable_variables), batch_axis
            )
            return original_apply(grads, trainable_variables)

        object.__setattr__(optimizer, "apply", apply)
        wrapped.append((optimizer, "apply"))
    try:
        yield
    finally:
        for owner, name in wrapped:
            object.__delattr__(owner, name)
