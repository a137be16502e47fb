"""The PS tutorial's custom training loop, counting what its metric counted.

From TF's parameter_server_training tutorial ("Training with a custom training
loop"): string features looked up with `StringLookup` in the per-worker
dataset, an `Embedding` + `Dense` model, a `step_fn` with a `GradientTape`
scheduled `steps_per_epoch` times per epoch with `ClusterCoordinator.schedule`,
`accuracy.update_state` on the workers, `join()` at the end of each epoch.
Changes for an exact check: 192 examples (so every batch has 32) and Keras 3
names (`keras.optimizers.RMSprop`, `reduction=None`).

Environment: KR_TEST_PARTITION=1 creates the strategy with the tutorial's
`MinSizePartitioner` over every ps. The chief prints one JSON line: the metric's
`count` and `total` after the last epoch and `optimizer.iterations`. Run by
tests/parameter_server/test_custom_loop.py through launch.
With the partitioner the chief fails when the model is built (a clear error).
"""

import json
import os
import random

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_replicator as kr  # noqa: E402

partitioner = None
if os.environ.get("KR_TEST_PARTITION") == "1":
    num_ps = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["ps"])
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=num_ps
    )
# On ps and worker tasks the constructor serves, then exits 0.
strategy = kr.ParameterServerReplicator(variable_partitioner=partitioner)

feature_vocab = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong"]
label_vocab = ["yes", "no"]
with strategy.scope():
    feature_lookup_layer = keras.layers.StringLookup(
        vocabulary=feature_vocab, mask_token=None
    )
    label_lookup_layer = keras.layers.StringLookup(
        vocabulary=label_vocab, num_oov_indices=0, mask_token=None
    )

random.seed(0)
examples = {"features": [], "label": []}
for _ in range(192):
    features = random.sample(feature_vocab, 3)
    examples["features"].append(features)
    examples["label"].append(["yes"] if "avenger" in features else ["no"])


def dataset_fn(_):
    raw_dataset = tf.data.Dataset.from_tensor_slices(examples)
    return (
        raw_dataset.map(
            lambda x: (
                {"features": feature_lookup_layer(x["features"])},
                label_lookup_layer(x["label"]),
            )
        )
        .shuffle(192)
        .batch(32)
        .repeat()
    )


with strategy.scope():
    model_input = keras.layers.Input(shape=(3,), dtype="int64", name="features")
    emb_layer = keras.layers.Embedding(
        input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=16384
    )
    emb_output = keras.ops.mean(emb_layer(model_input), axis=1)
    dense_output = keras.layers.Dense(
        units=1,
        activation="sigmoid",
        kernel_regularizer=keras.regularizers.L2(1e-4),
    )(emb_output)
    model = keras.Model({"features": model_input}, dense_output)
    optimizer = keras.optimizers.RMSprop(learning_rate=0.1)
    accuracy = keras.metrics.Accuracy()


@tf.function
def step_fn(iterator):
    def replica_fn(batch_data, labels):
        with tf.GradientTape() as tape:
            pred = model(batch_data, training=True)
            per_example_loss = keras.losses.BinaryCrossentropy(reduction=None)(
                labels, pred
            )
            loss = tf.nn.compute_average_loss(per_example_loss)
            model_losses = model.losses
            if model_losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
        accuracy.update_state(labels, actual_pred)
        return loss

    batch_data, labels = next(iterator)
    losses = strategy.run(replica_fn, args=(batch_data, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)


@tf.function
def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)


per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
per_worker_iterator = iter(per_worker_dataset)
num_epochs = int(os.environ.get("KR_TEST_EPOCHS", "4"))
steps_per_epoch = 5
counts = []
for i in range(num_epochs):
    accuracy.reset_state()
    for _ in range(steps_per_epoch):
        coordinator.schedule(step_fn, args=(per_worker_iterator,))
    coordinator.join()
    counts.append(int(accuracy.count.numpy()))
    print(f"Finished epoch {i}, accuracy is {float(accuracy.result()):f}.")
loss = coordinator.schedule(step_fn, args=(per_worker_iterator,))
print(f"Final loss is {float(loss.fetch()):f}")
coordinator.join()
print(
    "RESULT "
    + json.dumps(
        {
            "counts": counts,
            "iterations": int(optimizer.iterations.numpy()),
        }
    ),
    flush=True,
)
