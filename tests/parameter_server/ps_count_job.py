"""The PS tutorial's `fit` on a dataset function, counting the steps that ran.

From TF's parameter_server_training tutorial: `steps_per_execution=10`, 5 epochs
of 20 steps. The chief prints how many steps were scheduled, how many ran (an
atomic counter on the ps, incremented by each train step) and the optimizer's
`iterations`. Run by tests/parameter_server/test_training.py through launch.
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_replicator as kr  # noqa: E402

strategy = kr.auto(verbose=False)  # on ps and worker tasks: serves, then exits 0


def dataset_fn(input_context):
    global_batch_size = 64
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    x = tf.random.uniform((10, 10))
    y = tf.random.uniform((10,))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
    dataset = dataset.shard(
        input_context.num_input_pipelines, input_context.input_pipeline_id
    )
    return dataset.batch(batch_size).prefetch(2)


class Counted(keras.Sequential):
    def train_step(self, data):
        logs = super().train_step(data)
        self.ran.assign_add(1)  # tf.Variable: an atomic AssignAddVariableOp.
        return logs


with strategy.scope():
    model = Counted([keras.Input((10,)), keras.layers.Dense(1)])
    model.ran = tf.Variable(0, dtype=tf.int64, trainable=False)
    model.compile(keras.optimizers.SGD(), loss="mse", steps_per_execution=10)

scheduled = []


class CountScheduled(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        scheduled.append(batch)


model.fit(
    dataset_fn, epochs=5, steps_per_epoch=20, callbacks=[CountScheduled()], verbose=0
)
print(
    "RESULT "
    + json.dumps(
        {
            "ran": int(model.ran.numpy()),
            "iterations": int(model.optimizer.iterations.numpy()),
            "batch_callbacks": len(scheduled),
        }
    ),
    flush=True,
)
