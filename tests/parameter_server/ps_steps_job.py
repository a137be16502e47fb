"""A chief + workers + ps job for `test_parameter_server_steps.py` (run by launch).

The TF-Replicator form under async training: `distribute_input(input_fn)` and
`run_steps(step_fn, ...)` fit a linear regression whose exact solution is known.
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_replicator as kr  # noqa: E402

TRUE_WEIGHTS = np.array([[1.5], [-2.0], [0.5], [3.0]], np.float32)

strategy = kr.auto()  # on ps and worker tasks: serves, then exits 0


def input_fn(input_context):
    x = (
        np.random.default_rng(input_context.input_pipeline_id)
        .normal(size=(512, 4))
        .astype(np.float32)
    )
    dataset = tf.data.Dataset.from_tensor_slices((x, x @ TRUE_WEIGHTS))
    return dataset.repeat().batch(32)


with strategy.scope():
    kernel = keras.Variable(np.zeros((4, 1), np.float32), name="kernel")
    optimizer = keras.optimizers.SGD(learning_rate=0.1)


def step_fn(batch):
    x, y = batch
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(x @ kernel.value - y))
    gradients = tape.gradient(loss, [kernel.value])
    optimizer.apply_gradients(zip(gradients, [kernel]))
    return loss


iterator = iter(strategy.distribute_input(input_fn))
first = strategy.run_steps(step_fn, iterator, num_steps=1)
losses = [strategy.run_steps(step_fn, iterator, num_steps=5) for _ in range(40)]
strategy.coordinator.join()
print(
    "RESULT "
    + json.dumps(
        {
            "first_loss": float(first.fetch()),
            "last_loss": float(losses[-1].fetch()),
            "kernel": kernel.numpy().ravel().tolist(),
            "true": TRUE_WEIGHTS.ravel().tolist(),
        }
    ),
    flush=True,
)
