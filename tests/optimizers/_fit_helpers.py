"""Small float64 training runs shared by the Neumann and NLCG tests.

`recorded_fit` and `fit_on_workers` are the same run on one device, under a
strategy and in worker processes (which import this module from the repository).
"""

from __future__ import annotations

import json
import sys
import textwrap

import keras
import numpy as np
import tensorflow as tf

from keras_replicator.launch import run_workers
from keras_replicator.optimizers import NLCG, Neumann, UseTrueWeights, observe_loss
from keras_replicator.testing import _workloads


class LossObservingModel(keras.Model):
    """Keras' default train step plus the `observe_loss` call (test-only wiring).

    The loss inside a replica is that replica's mean; `sample_count` makes
    `observe_loss` form the global-batch mean (what the library's step will pass).
    """

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, self.trainable_variables)
        observe_loss(self.optimizer, loss, sample_count=tf.shape(x)[0])
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def data(num_samples=100, seed=0):
    x, y = _workloads.classification_data(num_samples, seed)
    return x.astype("float64"), y


def model(optimizer_fn, strategy=None, seed=1, model_class=keras.Model):
    """A float64 two-layer classifier compiled with `optimizer_fn()`."""
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        inputs = keras.Input((_workloads.NUM_FEATURES,), dtype="float64")
        hidden = keras.layers.Dense(
            8, activation="tanh", dtype="float64", name="hidden"
        )(inputs)
        outputs = keras.layers.Dense(
            _workloads.NUM_CLASSES, dtype="float64", name="logits"
        )(hidden)
        net = model_class(inputs, outputs, name="net")
        net.compile(
            optimizer_fn(),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=False,
        )
    return net


def assert_weights_close(a, b, atol):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=0, atol=atol)


# Optimizers the replica and worker tests train with, by name (worker processes
# rebuild them from the name).
OPTIMIZERS = {
    # loss_smoothing=0: the loss average after a step is the loss handed over;
    # lr 2.0, period 3: a step-control cut happens within the fit (asserted).
    "nlcg": lambda: NLCG(2.0, step_control_period=3, loss_smoothing=0.0),
    "neumann": lambda: Neumann(
        0.25, reset_steps=5, burn_in_steps=2, mu_steps=4.0, beta=1e-7
    ),
}


def recorded_fit(
    strategy, optimizer, num_samples, *, initial=None, epochs=3, callbacks=()
):
    """A `fit` of `OPTIMIZERS[optimizer]`: weights and, for NLCG, what it was handed.

    Returns a JSON-able dict: `weights` (lists), and per step `seen` (the loss
    NLCG was handed) and `multipliers` (its step multiplier), empty for others.
    """
    x, y = data(num_samples)
    net = model(OPTIMIZERS[optimizer], strategy)
    if initial is not None:
        net.set_weights([np.asarray(w) for w in initial])
    seen, multipliers = [], []

    def record(batch, logs):
        if isinstance(net.optimizer, NLCG):
            seen.append(float(net.optimizer._loss_ema.numpy()))
            multipliers.append(float(net.optimizer.step_multiplier.numpy()))

    callbacks = [*callbacks, keras.callbacks.LambdaCallback(on_train_batch_end=record)]
    if optimizer == "neumann":
        callbacks.append(UseTrueWeights())
    net.fit(
        x,
        y,
        batch_size=32,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    weights = [w.tolist() for w in net.get_weights()]
    return {"weights": weights, "seen": seen, "multipliers": multipliers}


_WORKER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras
    import keras_replicator as kr
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    from tests.optimizers import _fit_helpers
    strategy = kr.MultiWorkerReplicator(collective_timeout=60)
    result = _fit_helpers.recorded_fit(
        strategy,
        sys.argv[1],
        int(sys.argv[3]),
        initial=json.loads(sys.argv[2]),
        epochs=int(sys.argv[4]),
    )
    print("RESULT " + json.dumps(result))
    """
)


def fit_on_workers(optimizer, initial, num_samples, epochs, num_workers=2):
    """`recorded_fit` under `MultiWorkerReplicator` in `num_workers` processes."""
    command = [
        sys.executable,
        "-c",
        _WORKER,
        optimizer,
        json.dumps([np.asarray(w).tolist() for w in initial]),
        str(num_samples),
        str(epochs),
    ]
    result = run_workers(command, num_workers, timeout=240, echo=False)
    assert result.ok, result.describe_failure()
    results = []
    for worker in result.workers:
        line = next(x for x in worker.output.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT ") :]))
    return results
