"""Keras 3 train / test / predict functions that are correct under our strategies.

Keras 3's TensorFlow trainer builds its step functions in a way that breaks on
tf.distribute (keras-team/keras#20585, #21172): a ``tf.cond`` around
``strategy.run`` inside the ``steps_per_execution`` loop fails under MirroredStrategy,
``jit_compile=True`` compiles the gradient all-reduce and the variable update into one
XLA cluster (impossible across CPU devices), and the per-replica outputs are reduced
with a scalar ``axis=0`` reduce that MultiWorkerMirroredStrategy rejects.

Here the same steps are rebuilt from public pieces (``model.train_step``,
``strategy.run``, ``tf.data`` optionals). ``_hooks`` routes Keras' own
``make_*_function`` to these builders when the model's strategy is one of ours, and
leaves stock strategies untouched. What each builder does differently:

* every replica's step runs inside ``counting_samples`` so the gradient all-reduce can
  weight replicas by their sample counts (see ``_sample_count``);
* ``steps_per_execution`` runs in ``_loop.run_loop``, where ``strategy.run`` is never
  inside a ``tf.cond``;
* ``jit_compile`` compiles each replica's forward and backward pass statelessly with
  XLA and keeps the all-reduce and the updates outside the compiled function;
* per-replica logs are averaged across replicas and, on several workers, across
  workers (on the socket ring in the step's last ring call, else one collective
  per dtype), so every worker logs the same numbers; when
  `CrossReplicaMetrics` asks, a variant of the step replaces metric logs with exact
  global-batch values (`_global_metrics`);
* while a `BackupAndRestore` listens for preemption on several workers, a variant of
  the training step takes the worker's preemption flag as an argument, averages it
  with the logs (no collective of its own) and returns it beside them; the function
  hands it to `_preemption.StepAgreement`, never to Keras.
"""

from __future__ import annotations

import warnings

import keras
import tensorflow as tf
from keras import tree

from keras_replicator._replicator_state import replicator_state
from keras_replicator._worker import preemption as _preemption
from keras_replicator.communication import _all_reduce
from keras_replicator.keras_integration import (
    _global_metrics,
    _loop,
    _sample_count,
    _sample_counter,
)


def make_train_function(model, loss_tracker):
    step = model.train_step
    if model.jit_compile and not model.run_eagerly:
        if _has_synchronized_layers(model):
            warnings.warn(
                "`jit_compile=True` with synchronized layers (e.g. "
                "`BatchNormalization(synchronized=True)`): the training step runs "
                "without XLA, because their cross-replica reduction cannot be "
                "compiled on this backend.",
                stacklevel=3,
            )
        elif type(model).train_step is keras.Model.train_step:
            step = _xla_train_step(model, loss_tracker)
        else:
            warnings.warn(
                "`jit_compile=True` with a custom `train_step` under a distribution "
                "strategy: the step runs without XLA, because XLA cannot compile the "
                "cross-replica all-reduce inside it on this backend. Override "
                "`compute_loss` instead of `train_step` to keep XLA.",
                stacklevel=3,
            )
    counter = _sample_counter.counter_for(model)
    return _make_loop_function(model, _replica_steps(model, step, counter), "train")


def make_test_function(model, loss_tracker):
    step = model.test_step
    if model.jit_compile and not model.run_eagerly:
        if type(model).test_step is keras.Model.test_step:
            step = _xla_test_step(model, loss_tracker)
        else:
            warnings.warn(
                "`jit_compile=True` with a custom `test_step` under a distribution "
                "strategy: the step runs without XLA.",
                stacklevel=3,
            )
    return _make_loop_function(model, _replica_steps(model, step), "test")


def make_predict_function(model):
    strategy = model.distribute_strategy
    step = model.predict_step
    if (
        model.jit_compile
        and not model.run_eagerly
        and type(model).predict_step is keras.Model.predict_step
    ):
        forward = _xla_inference(model)

        def step(data):
            x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
            return forward(x)

    @tf.autograph.experimental.do_not_convert
    def one_step(data):
        outputs = strategy.run(step, args=(data,))
        return tree.map_structure(lambda v: _concat_replicas(strategy, v), outputs)

    @tf.autograph.experimental.do_not_convert
    def predict_function(data_list):
        outputs = one_step(data_list[0])
        for data in data_list[1:]:
            more = one_step(data)
            outputs = tree.map_structure(
                lambda a, b: tf.concat([a, b], axis=0), outputs, more
            )
        return outputs

    if not model.run_eagerly:
        predict_function = tf.function(predict_function, reduce_retracing=True)
    return predict_function


def _replica_steps(model, step, counter=None):
    """`make(global_metrics, agreeing)` -> the replica function around Keras' `step`.

    `agreeing`: it takes the preemption flag too and returns `(logs, agreed)`.
    """
    across_workers = replicator_state(model.distribute_strategy).is_multi_worker

    def make(global_metrics: bool, agreeing: bool = False):
        def replica_step(data, *flag):
            x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
            count = _sample_count.batch_size_of(x)
            with _sample_count.counting_samples(count):
                outputs = _read_variables(step(data))
            if counter is not None:
                counter.assign_add(tf.cast(count, tf.float64))
            exact = {}
            if global_metrics and isinstance(outputs, dict):
                exact = _global_metrics.global_results(model.metrics)
                exact = {k: v for k, v in exact.items() if k in outputs}
            rest = (
                {k: v for k, v in outputs.items() if k not in exact}
                if exact
                else outputs
            )
            if agreeing:  # the preemption flag rides the logs' all-reduce
                rest, agreed = _mean_over_workers((rest, _like_logs(flag[0], rest)))
            elif across_workers:
                rest = _mean_over_workers(rest)
            outputs = {**rest, **exact} if exact else rest
            return (outputs, agreed) if agreeing else outputs

        return replica_step

    return make


def _like_logs(flag, logs):
    """The flag in the logs' first float dtype: no collective of its own.

    A new tensor in each replica: the argument itself is one object on every
    replica, which TensorFlow's collectives would not reduce as a replica's value.
    """
    floats = [v for v in tree.flatten(logs) if tf.is_tensor(v) and _is_float(v)]
    return tf.identity(tf.cast(flag, floats[0].dtype if floats else tf.float32))


def _make_loop_function(model, make_replica_step, phase):
    strategy = model.distribute_strategy
    steps_per_execution = int(model.steps_per_execution)
    variants = {}

    def variant(global_metrics: bool, agreeing: bool):
        if (global_metrics, agreeing) not in variants:
            replica_step = make_replica_step(global_metrics, agreeing)

            @tf.autograph.experimental.do_not_convert
            def one_step(data, *flag):
                outputs = strategy.run(replica_step, args=(data, *flag))
                return _mean_over_replicas(strategy, outputs)

            def multi_step(iterator, *flag):
                def step(data):
                    return one_step(data, *flag)

                return _loop.run_loop(step, iterator, steps_per_execution)

            if not model.run_eagerly:
                # No AutoGraph: the loop is written in tf.while_loop / tf.cond and
                # the step under it is never converted (Keras' own step functions
                # are `do_not_convert` too); converting this wrapper alone cost
                # 51-86 ms of a profiled first step (issue 36).
                multi_step = tf.function(
                    multi_step, reduce_retracing=True, autograph=False
                )
            variants[global_metrics, agreeing] = (one_step, multi_step)
        return variants[global_metrics, agreeing]

    def function(iterator):
        # A `BackupAndRestore` listening on several workers (`_preemption`).
        agreement = _preemption.step_agreement(model) if phase == "train" else None
        flag = () if agreement is None else (agreement.local_flag(),)
        one_step, multi_step = variant(
            _global_metrics.due(model, phase), agreement is not None
        )
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            outputs = multi_step(iterator, *flag)
        else:
            # `train_on_batch` / `test_on_batch` pass a Python generator of one batch.
            outputs = None
            for data in iterator:
                outputs = one_step(data, *flag)
        if agreement is not None and outputs is not None:
            outputs, agreed = outputs
            agreement.record(agreed)
        return outputs

    return function


def _mean_over_replicas(strategy, outputs):
    """Averages float outputs over local replicas; other outputs: replica 0's."""

    def reduce(value):
        local = strategy.experimental_local_results(value)
        if len(local) > 1 and _is_float(local[0]):
            return tf.reduce_mean(
                tf.stack([tf.convert_to_tensor(v) for v in local]), axis=0
            )
        return local[0]

    return tree.map_structure(reduce, outputs)


def _mean_over_workers(outputs):
    """In a replica: averages float outputs over all replicas.

    Only needed across workers, where the local mean would be one worker's view.
    On the socket ring it is one ring call after the gradient buckets, else one
    collective per dtype (`_all_reduce.mean_over_replicas`).
    """
    flat = tree.flatten(outputs)
    floats = [i for i, v in enumerate(flat) if tf.is_tensor(v) and _is_float(v)]
    if not floats:
        return outputs
    means = _all_reduce.mean_over_replicas([flat[i] for i in floats])
    for i, mean in zip(floats, means):
        flat[i] = mean
    return tree.pack_sequence_as(outputs, flat)


def _read_variables(outputs):
    """Step outputs with every variable read into a tensor (this replica's value).

    A metric's `result()` may return its Keras variable itself (the Keras guide's
    `CategoricalTruePositives` does). Returned from `strategy.run` as is, a
    sync-on-read variable would be reduced outside the replica, across workers too,
    which the multi-worker step cannot do; read here it is a plain per-replica value
    like any other metric result.
    """

    def read(value):
        if isinstance(value, (keras.Variable, tf.Variable)):
            return tf.identity(tf.convert_to_tensor(value))
        return value

    return tree.map_structure(read, outputs)


def _is_float(value) -> bool:
    """Whether a step output is floating point.

    A metric's `result()` may return its Keras variable itself (the Keras guide's
    `CategoricalTruePositives` does), whose `dtype` is a string, not a `tf.DType`.
    """
    return tf.as_dtype(value.dtype).is_floating


def _concat_replicas(strategy, value):
    """All replicas' rows in global order (worker-major, then local replica order)."""
    if not replicator_state(strategy).is_multi_worker:
        local = list(strategy.experimental_local_results(value))
        return tf.concat(local, axis=0) if local[0].shape.rank else tf.stack(local)
    rows = strategy.run(_gather_rows_in_replica, args=(value,))
    return strategy.experimental_local_results(rows)[0]


def _gather_rows_in_replica(rows):
    """All-gathers `rows` whose leading length may differ from replica to replica."""
    context = tf.distribute.get_replica_context()
    if rows.shape.rank == 0:
        return context.all_gather(tf.reshape(rows, [1]), axis=0)
    length = tf.shape(rows)[0]
    lengths = context.all_gather(tf.reshape(length, [1]), axis=0)
    longest = tf.reduce_max(lengths)
    padding = [[0, longest - length]] + [[0, 0]] * (rows.shape.rank - 1)
    gathered = context.all_gather(tf.pad(rows, padding), axis=0)
    keep = tf.reshape(tf.sequence_mask(lengths, longest), [-1])
    return tf.boolean_mask(gathered, keep)


def _has_synchronized_layers(layer) -> bool:
    if getattr(layer, "synchronized", False):
        return True
    return any(_has_synchronized_layers(sub) for sub in getattr(layer, "layers", []))


def _xla_train_step(model, loss_tracker):
    """Keras' default `train_step` with only the forward/backward pass under XLA.

    The compiled function is stateless: variable values go in as arguments and the
    new values of non-trainable state (batch-norm statistics, seeds, loss metrics)
    come out, so XLA never touches another replica's variables. The gradient
    all-reduce, the optimizer update and the state writes run outside it.
    """
    changed_state: list[int] = []

    @tf.function(jit_compile=True, reduce_retracing=True)
    def forward_backward(trainable_values, state_values, loss_scale, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        state = model.non_trainable_variables + model.metrics_variables
        mapping = list(zip(model.trainable_variables, trainable_values))
        mapping += list(zip(state, state_values))
        with tf.GradientTape() as tape:
            tape.watch(trainable_values)
            with keras.StatelessScope(state_mapping=mapping) as scope:
                y_pred = model(x, training=True)
                loss = model.compute_loss(
                    x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
                )
            scaled_loss = loss * tf.cast(loss_scale, loss.dtype)
        gradients = tape.gradient(scaled_loss, trainable_values)
        changed_state.clear()
        new_values = []
        for index, variable in enumerate(state):
            value = scope.get_current_value(variable)
            if value is not None:
                changed_state.append(index)
                new_values.append(value)
        return y_pred, loss, gradients, new_values

    def train_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        trainable = model.trainable_variables
        state = model.non_trainable_variables + model.metrics_variables
        loss_scale = model.optimizer.scale_loss(tf.constant(1.0))
        y_pred, loss, gradients, new_values = forward_backward(
            [v.value for v in trainable], [v.value for v in state], loss_scale, data
        )
        for index, value in zip(changed_state, new_values):
            state[index].assign(value)
        loss_tracker.update_state(loss, sample_weight=_sample_count.batch_size_of(x))
        # `scale_loss` saw a placeholder: an optimizer that records the loss it
        # scales (NLCG) gets the real one, replacing it; the result is unused (a
        # second call scales nothing again: the step's sample count is taken).
        model.optimizer.scale_loss(loss)
        model.optimizer.apply_gradients(zip(gradients, trainable))
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return train_step


def _xla_inference(model):
    """`model(x, training=False)` compiled with XLA, reading no variable inside.

    Variables go in as arguments: XLA on CPU replicas cannot read a variable that
    lives on another logical device from inside a compiled function.
    """

    @tf.function(jit_compile=True, reduce_retracing=True)
    def forward(values, x):
        variables = model.trainable_variables + model.non_trainable_variables
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return model(x, training=False)

    def call(x):
        variables = model.trainable_variables + model.non_trainable_variables
        return forward([v.value for v in variables], x)

    return call


def _xla_test_step(model, loss_tracker):
    """Keras' default `test_step` with the forward pass under XLA."""
    forward = _xla_inference(model)

    def test_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = forward(x)
        loss = model.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
        )
        loss_tracker.update_state(loss, sample_weight=_sample_count.batch_size_of(x))
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return test_step
