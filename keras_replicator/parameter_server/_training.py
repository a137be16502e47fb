"""Keras 3 `fit` / `evaluate` / `predict` on a `ParameterServerReplicator`.

Keras 3's loop assumes every step runs here, synchronously. Under parameter-server
training the chief only *schedules* steps: each call of the per-step function is
handed to the `ClusterCoordinator`, which runs it on a free worker, and the chief
waits only at the end of an epoch (`join`). So this is a loop of its own, built from
Keras' public pieces (`train_step`, `CallbackList`, `get_metrics_result`), as
`tf_keras` did inside `Model.fit`:

- `steps_per_epoch` counts steps over all workers; `steps_per_execution` steps
  run per scheduled function on one worker.
- Batch-level callbacks are called when a step is *scheduled*, with empty logs
  (reading the metrics would wait for the workers). Epoch logs are read from the
  metric variables on the parameter servers after `join`; several workers update
  them concurrently, each increment atomic (`_compat.install_atomic_updates`), so
  every step is counted, on the weights that step saw.
- `evaluate` and `predict` send chief-side batches to the workers for the
  forward pass and update the metrics on the chief, in order: their numbers are
  exact for the weights they see. A dataset function is evaluated on the workers
  instead (approximate logs, `steps` required).
- The forward passes of `evaluate` / `predict` only read the weights, so a
  transient gRPC failure reruns them (`_retry`); training steps never are.
"""

from __future__ import annotations

import weakref

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from keras_replicator import _compat
from keras_replicator.parameter_server import _data, _faults, _retry

_functions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fit(
    model,
    x=None,
    y=None,
    batch_size=None,
    epochs=1,
    verbose="auto",
    callbacks=None,
    validation_split=0.0,
    validation_data=None,
    shuffle=True,
    class_weight=None,
    sample_weight=None,
    initial_epoch=0,
    steps_per_epoch=None,
    validation_steps=None,
    validation_batch_size=None,
    validation_freq=1,
):
    """`Model.fit` with steps scheduled on the workers (see the module doc)."""
    del shuffle  # Every worker shuffles its own repeated pipeline.
    _unsupported(validation_split=validation_split, class_weight=class_weight)
    strategy = model.distribute_strategy
    data = _data.training_input(
        strategy, x, y, sample_weight, batch_size, steps_per_epoch
    )
    _build(model, strategy, data.sample_batch)
    coordinator = strategy.coordinator
    iterator = _faults.call(
        lambda: iter(coordinator.create_per_worker_dataset(data.per_worker))
    )
    per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
    verbose = 1 if verbose == "auto" else verbose
    callback_list = keras.callbacks.CallbackList(
        callbacks,
        add_history=True,
        add_progbar=verbose != 0,
        verbose=verbose,
        epochs=epochs,
        steps=data.steps_per_epoch,
        model=model,
    )
    model.stop_training = False
    callback_list.on_train_begin()
    initial_epoch = _compat.initial_epoch_of(model) or initial_epoch
    logs = {}
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callback_list.on_epoch_begin(epoch)
        step = 0
        while step < data.steps_per_epoch and not model.stop_training:
            count = min(per_call, data.steps_per_epoch - step)
            callback_list.on_train_batch_begin(step)
            function = _train_function(model, strategy, count)
            _faults.call(coordinator.schedule, function, args=(iterator,))
            step += count
            callback_list.on_train_batch_end(step - 1, {})
        _faults.wait(strategy, f"epoch {epoch + 1} of fit")
        logs = _read_logs(model)
        if validation_data is not None and (epoch + 1) % validation_freq == 0:
            val_x, val_y, val_w = keras.utils.unpack_x_y_sample_weight(validation_data)
            val_logs = _evaluate_logs(
                model,
                val_x,
                val_y,
                val_w,
                validation_batch_size or batch_size,
                validation_steps,
            )
            logs.update({f"val_{name}": value for name, value in val_logs.items()})
        callback_list.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    callback_list.on_train_end(logs)
    return model.history


def evaluate(
    model,
    x=None,
    y=None,
    batch_size=None,
    verbose="auto",
    sample_weight=None,
    steps=None,
    callbacks=None,
    return_dict=False,
    **kwargs,
):
    """`Model.evaluate`: forward passes on the workers, metrics in order."""
    del verbose, callbacks, kwargs
    logs = _evaluate_logs(model, x, y, sample_weight, batch_size, steps)
    if return_dict:
        return logs
    values = list(logs.values())
    return values[0] if len(values) == 1 else values


def predict(model, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
    """`Model.predict`: batches sent to free workers, outputs back in order."""
    del verbose, callbacks
    if callable(x) and not isinstance(x, tf.data.Dataset):
        raise ValueError(
            "`x` must be arrays or a finite `tf.data.Dataset` for `predict` under "
            "parameter-server training: outputs must come back in input order, "
            "which per-worker dataset functions cannot promise. Received: a "
            "function. Pass the dataset itself."
        )
    batches = list(_data.chief_batches(x, None, None, batch_size, steps))
    outputs = _retry.run_all(
        model.distribute_strategy,
        _forward_function(model),
        [(_inputs_of(batch),) for batch in batches],
        "predict",
    )
    if not outputs:
        raise ValueError("`x` is empty: there is nothing to predict.")
    return tree.map_structure(lambda *parts: np.concatenate(parts), *outputs)


def _evaluate_logs(model, x, y, sample_weight, batch_size, steps):
    strategy = model.distribute_strategy
    coordinator = strategy.coordinator
    model.reset_metrics()
    if callable(x) and not isinstance(x, tf.data.Dataset):
        data = _data.training_input(strategy, x, y, sample_weight, None, steps)
        _build(model, strategy, data.sample_batch)
        iterator = iter(coordinator.create_per_worker_dataset(data.per_worker))
        function = _test_function(model, strategy)
        for _ in range(data.steps_per_epoch):
            _faults.call(coordinator.schedule, function, args=(iterator,))
        _faults.wait(strategy, "evaluate")
        return _read_logs(model)
    batches = list(_data.chief_batches(x, y, sample_weight, batch_size, steps))
    if not batches:
        raise ValueError("The evaluation data is empty: it must yield a batch.")
    _build(model, strategy, batches[0])
    predictions = _retry.run_all(
        strategy,
        _forward_function(model),
        [(_inputs_of(batch),) for batch in batches],
        "evaluate",
    )
    update = _update_function(model)
    for batch, batch_predictions in zip(batches, predictions):
        inputs, targets, weights = keras.utils.unpack_x_y_sample_weight(batch)
        update(inputs, targets, weights, batch_predictions)
    return _read_logs(model)


def _inputs_of(batch):
    return keras.utils.unpack_x_y_sample_weight(batch)[0]


def _build(model, strategy, sample_batch) -> None:
    """Creates every variable on the chief, in scope (so they live on the ps)."""
    _compat.symbolic_build(model, sample_batch)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        with strategy.scope():
            optimizer.build(model.trainable_variables)


def _read_logs(model) -> dict:
    return {
        name: float(value) if np.ndim(value) == 0 else np.asarray(value)
        for name, value in model.get_metrics_result().items()
    }


def _cache(model):
    if model not in _functions:
        _functions[model] = {}
    return _functions[model]


def _train_function(model, strategy, count):
    cache = _cache(model)
    key = ("train", count)
    if key not in cache:

        @tf.function
        def train(iterator):
            for _ in range(count):
                strategy.run(model.train_step, args=(next(iterator),))

        cache[key] = train
    return cache[key]


def _test_function(model, strategy):
    cache = _cache(model)
    if "test" not in cache:

        @tf.function
        def test(iterator):
            strategy.run(model.test_step, args=(next(iterator),))

        cache["test"] = test
    return cache["test"]


def _forward_function(model):
    cache = _cache(model)
    if "forward" not in cache:

        @tf.function(reduce_retracing=True)
        def forward(inputs):
            return model(inputs, training=False)

        cache["forward"] = forward
    return cache["forward"]


def _update_function(model):
    cache = _cache(model)
    if "update" not in cache:
        tracker = _compat.loss_tracker(model)

        @tf.function(reduce_retracing=True)
        def update(inputs, targets, weights, predictions):
            loss = model.compute_loss(
                x=inputs,
                y=targets,
                y_pred=predictions,
                sample_weight=weights,
                training=False,
            )
            count = tf.shape(tree.flatten(inputs)[0])[0]
            tracker.update_state(loss, sample_weight=count)
            model.compute_metrics(inputs, targets, predictions, sample_weight=weights)

        cache["update"] = update
    return cache["update"]


def _unsupported(**arguments):
    for name, value in arguments.items():
        if value:
            raise ValueError(
                f"`{name}` is not supported under parameter-server training. "
                f"Received: {name}={value!r}. Use `validation_data` instead of "
                "`validation_split`, and weight samples in the dataset instead of "
                "`class_weight`."
            )
