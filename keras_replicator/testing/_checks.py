"""The conformance checks: what a Replicator strategy promises Keras users.

Each check takes a built strategy, runs a workload on it and on one device from the
same initial weights (`_harness.compare_to_one_device`) and raises `CheckFailure` (or
any error the strategy causes) when the promise is broken. Tolerances are stated per
check: float32 1e-5; mixed precision looser (bfloat16 1e-2, float16 1e-3), since one
device and N replicas round bfloat16 / float16 activations in different orders.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from keras_replicator.testing import _day_one_checks
from keras_replicator.testing import _workloads as w
from keras_replicator.testing._harness import CheckFailure, compare_to_one_device

BATCH = 64


def _weights_and_history(model, history):
    out = {"weights": model.get_weights()}
    out.update({k: np.asarray(v) for k, v in history.history.items()})
    return out


def _fit(num_samples=1024, **fit_kwargs):
    x, y = w.classification_data(num_samples)

    def workload(model):
        history = model.fit(
            x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, **fit_kwargs
        )
        return _weights_and_history(model, history)

    return workload


def fit_numpy(strategy):
    return compare_to_one_device(strategy, w.mlp, _fit())


def fit_dataset(strategy):
    import tensorflow as tf

    x, y = w.classification_data(1024)

    def workload(model):
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
        return _weights_and_history(model, model.fit(dataset, epochs=2, verbose=0))

    return compare_to_one_device(strategy, w.mlp, workload)


def sample_weight(strategy):
    weights = np.random.default_rng(3).uniform(0.1, 2.0, 1024).astype("float32")
    return compare_to_one_device(strategy, w.mlp, _fit(sample_weight=weights))


def validation_data(strategy):
    return compare_to_one_device(
        strategy, w.mlp, _fit(validation_data=w.classification_data(333, seed=7))
    )


def uneven_last_batch(strategy):
    return compare_to_one_device(strategy, w.mlp, _fit(num_samples=1001))


def steps_per_execution(strategy):
    return compare_to_one_device(
        strategy, lambda: w.mlp(steps_per_execution=4), _fit(num_samples=1001)
    )


def jit_compile(strategy):
    return compare_to_one_device(
        strategy, lambda: w.mlp(jit_compile=True), _fit(num_samples=1001)
    )


def string_dict_inputs(strategy):
    import tensorflow as tf

    x, y = w.string_dict_data(1001)

    def workload(model):
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
        history = model.fit(dataset, epochs=2, verbose=0)
        out = _weights_and_history(model, history)
        features = tf.data.Dataset.from_tensor_slices(x).batch(BATCH)
        out["predict"] = model.predict(features, verbose=0)
        return out

    return compare_to_one_device(strategy, w.string_dict_model, workload)


def synchronized_batch_norm(strategy):
    return compare_to_one_device(
        strategy, lambda: w.mlp(batch_norm="synchronized"), _fit(num_samples=1024)
    )


def mixed_bfloat16(strategy):
    return compare_to_one_device(
        strategy, w.mlp, _fit(), policy="mixed_bfloat16", tolerance=1e-2
    )


def mixed_float16(strategy):
    return compare_to_one_device(
        strategy, w.mlp, _fit(), policy="mixed_float16", tolerance=1e-3
    )


def evaluate(strategy):
    x, y = w.classification_data(1001, seed=5)
    weights = np.random.default_rng(4).uniform(0.1, 2.0, 1001).astype("float32")

    def workload(model):
        plain = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
        weighted = model.evaluate(
            x, y, sample_weight=weights, batch_size=BATCH, verbose=0, return_dict=True
        )
        return {"plain": plain, "weighted": weighted}

    return compare_to_one_device(strategy, w.mlp, workload)


def predict(strategy):
    x, _ = w.classification_data(1001, seed=6)

    def workload(model):
        predictions = model.predict(x, batch_size=BATCH, verbose=0)
        if predictions.shape[0] != len(x):
            raise CheckFailure(
                f"predict returned {predictions.shape[0]} of {len(x)} rows"
            )
        return {"predict": predictions}

    return compare_to_one_device(strategy, w.mlp, workload)


def custom_metric(strategy):
    def model():
        return w.mlp(metrics=("accuracy", w.true_positives_metric()))

    return compare_to_one_device(strategy, model, _fit(num_samples=1001))


def custom_train_step_loss(strategy):
    model_class = w.custom_train_step_class()
    return compare_to_one_device(
        strategy, lambda: w.mlp(model_class=model_class), _fit()
    )


def custom_train_step_mean_loss(strategy):
    model_class = w.mean_loss_train_step_class()

    def workload(model):
        x, y = w.classification_data(1001)
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        return {"weights": model.get_weights()}

    return compare_to_one_device(
        strategy, lambda: w.mlp(model_class=model_class), workload
    )


def variables_in_scope(strategy):
    with strategy.scope():
        model = w.mlp()
        model.optimizer.build(model.trainable_variables)
    variables = model.variables + list(model.optimizer.variables)
    outside = [
        v.path
        for v in variables
        if not strategy.extended.variable_created_in_scope(v.value)
    ]
    if outside:
        raise CheckFailure(f"variables not created in the strategy's scope: {outside}")
    return 0.0, {}


def save_load(strategy):
    import keras

    x, y = w.classification_data(1024)
    with strategy.scope():
        model = w.mlp()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    expected = model.predict(x, batch_size=BATCH, verbose=0)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        loaded = keras.models.load_model(path)
        with strategy.scope():
            loaded_in_scope = keras.models.load_model(path)
    errors = {
        "one_device": float(np.max(np.abs(loaded.predict(x, verbose=0) - expected))),
        "in_scope": float(
            np.max(np.abs(loaded_in_scope.predict(x, verbose=0) - expected))
        ),
    }
    worst = max(errors.values())
    if worst > 1e-5:
        raise CheckFailure(f"reloaded model predicts differently: {errors}")
    return worst, errors


def restore_other_replica_count(strategy):
    import tensorflow as tf

    x, y = w.classification_data(1024)
    with strategy.scope():
        model = w.mlp()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    expected = model.get_weights()
    targets = {"one_device": tf.distribute.get_strategy()}
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        count = 2 if strategy.num_replicas_in_sync != 2 else 4
        targets[f"{count}_replicas"] = type(strategy)(
            devices=[f"/cpu:{i}" for i in range(count)]
        )
    errors = {}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trained.weights.h5")
        model.save_weights(path)
        for name, target in targets.items():
            with target.scope():
                restored = w.mlp()
            restored.load_weights(path)
            restored.fit(x[:256], y[:256], batch_size=BATCH, epochs=1, verbose=0)
            restored.load_weights(path)
            errors[name] = max(
                float(np.max(np.abs(a - b)))
                for a, b in zip(expected, restored.get_weights())
            )
    worst = max(errors.values())
    if worst > 0:
        raise CheckFailure(f"restored weights differ: {errors}")
    return worst, errors


def layouts_split_weights(strategy):
    """Some weight is split over a mesh (a device stores less than the whole
    model) and the split model trains like one device. For strategies with a
    `bytes_per_device(variables)` method (`kr.ModelParallelReplicator`); run by
    default on factories registered with `layouts=True`."""
    if not callable(getattr(strategy, "bytes_per_device", None)):
        raise CheckFailure(
            f"{type(strategy).__name__} has no `bytes_per_device(variables)`: it "
            "lays out no weights"
        )
    with strategy.scope():
        model = w.mlp()
    per_device = strategy.bytes_per_device(model.weights)
    whole = sum(np.asarray(v).nbytes for v in model.weights)
    if max(per_device) >= whole:
        raise CheckFailure(
            f"no weight is split: a device stores {max(per_device)} of the "
            f"{whole} bytes of weights"
        )
    worst, errors = compare_to_one_device(strategy, w.mlp, _fit(num_samples=1001))
    errors["largest_device_share"] = max(per_device) / whole
    return worst, errors


CHECKS = {
    "fit_numpy": (fit_numpy, "fit from NumPy arrays"),
    "fit_dataset": (fit_dataset, "fit from a tf.data.Dataset"),
    "sample_weight": (sample_weight, "fit with sample_weight"),
    "validation_data": (validation_data, "fit with validation_data"),
    "uneven_last_batch": (uneven_last_batch, "uneven last batch (1001 / 64)"),
    "steps_per_execution": (steps_per_execution, "steps_per_execution=4"),
    "jit_compile": (jit_compile, "jit_compile=True"),
    "string_dict_inputs": (string_dict_inputs, "string and dict inputs"),
    "synchronized_batch_norm": (
        synchronized_batch_norm,
        "BatchNormalization(synchronized=True)",
    ),
    "mixed_bfloat16": (mixed_bfloat16, "mixed_bfloat16 (tolerance 1e-2)"),
    "mixed_float16": (mixed_float16, "mixed_float16 (tolerance 1e-3)"),
    "evaluate": (evaluate, "evaluate, plain and sample-weighted"),
    "predict": (predict, "predict: all rows in order, partial last batch"),
    "custom_metric": (
        custom_metric,
        "a Metric subclass whose result() is its variable",
    ),
    "custom_train_step_loss": (
        custom_train_step_loss,
        "custom train_step logs compute_loss",
    ),
    "custom_train_step_mean_loss": (
        custom_train_step_mean_loss,
        "custom train_step with a tf.reduce_mean loss",
    ),
    "variables_in_scope": (variables_in_scope, "variables created in scope"),
    "save_load": (save_load, "save / load a .keras model"),
    "restore_other_replica_count": (
        restore_other_replica_count,
        "restore into another replica count",
    ),
}
CHECKS.update(_day_one_checks.CHECKS)
CHECKS["layouts_split_weights"] = (
    layouts_split_weights,
    "weights split over the mesh, training like one device",
)
