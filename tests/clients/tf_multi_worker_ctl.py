"""TensorFlow's "Custom training loop with Keras and MultiWorkerMirroredStrategy"
tutorial (tensorflow.org/tutorials/distribute/multi_worker_with_ctl), 2 workers.

`distribute_datasets_from_function` with a `dataset_fn` that shards by input
pipeline and batches per replica; the model, an RMSprop optimizer built lazily in
the first `strategy.run`, a metric and epoch/step counters created in the scope; a
`tf.function` step taking the iterator, the per-example loss divided by the global
batch (`tf.nn.compute_average_loss`) and the losses summed with `strategy.reduce`;
a `tf.train.CheckpointManager` written with the tutorial's `write_filepath` idiom
and restored at start, so a second run of the script resumes.

The shuffle is seeded and comes before the shard, so each step's two shards are the
one-device global batch.
"""

import os

from tests.clients._data import digits, scale
from tests.clients._registry import client_case
from tests.clients.tf_multi_worker_keras import (
    _barrier,
    _is_chief,
    _task,
    _write_filepath,
)

WORKERS = 2
GLOBAL_BATCH = 64
EPOCHS = 3
STEPS_PER_EPOCH = 4


def _mnist_dataset():
    import tensorflow as tf

    (x, y), _ = digits()
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .map(scale)
        .shuffle(len(x), seed=13)
        .repeat()
    )


def _dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = _mnist_dataset()
    dataset = dataset.shard(
        input_context.num_input_pipelines, input_context.input_pipeline_id
    )
    return dataset.batch(batch_size)


def _build_cnn_model():
    import keras

    return keras.Sequential(
        [
            keras.Input(shape=(8, 8, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def _train(strategy, workdir, num_epochs):
    """One run of the tutorial's script; returns the model and per-epoch losses."""
    import keras
    import tensorflow as tf

    dataset = strategy.distribute_datasets_from_function(
        lambda input_context: _dataset_fn(GLOBAL_BATCH, input_context)
    )
    with strategy.scope():
        multi_worker_model = _build_cnn_model()
        optimizer = keras.optimizers.RMSprop(learning_rate=0.01)
        train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
        epoch = tf.Variable(initial_value=0, dtype=tf.int64, name="epoch")
        step_in_epoch = tf.Variable(
            initial_value=0, dtype=tf.int64, name="step_in_epoch"
        )

    @tf.function
    def train_step(iterator):
        def step_fn(inputs):
            x, y = inputs
            with tf.GradientTape() as tape:
                predictions = multi_worker_model(x, training=True)
                per_example_loss = keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True, reduction=None
                )(y, predictions)
                loss = tf.nn.compute_average_loss(
                    per_example_loss, global_batch_size=GLOBAL_BATCH
                )
            grads = tape.gradient(loss, multi_worker_model.trainable_variables)
            optimizer.apply_gradients(
                zip(grads, multi_worker_model.trainable_variables)
            )
            train_accuracy.update_state(y, predictions)
            return loss

        per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None
        )

    task_type, task_id = _task(strategy)
    checkpoint_dir = os.path.join(workdir, "ckpt")
    checkpoint = tf.train.Checkpoint(
        model=multi_worker_model, epoch=epoch, step_in_epoch=step_in_epoch
    )
    write_checkpoint_dir = _write_filepath(checkpoint_dir, task_type, task_id)
    checkpoint_manager = tf.train.CheckpointManager(
        checkpoint, directory=write_checkpoint_dir, max_to_keep=1
    )
    latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
    if latest_checkpoint:
        checkpoint.restore(latest_checkpoint)

    losses, accuracies = [], []
    while epoch.numpy() < num_epochs:
        iterator = iter(dataset)
        total_loss = 0.0
        num_batches = 0
        while step_in_epoch.numpy() < STEPS_PER_EPOCH:
            total_loss += train_step(iterator)
            num_batches += 1
            step_in_epoch.assign_add(1)
        losses.append(float(total_loss / num_batches))
        accuracies.append(float(train_accuracy.result()))
        train_accuracy.reset_state()
        # Counters advance before the save (the tutorial saves first, so a resumed
        # run would start with an empty epoch).
        epoch.assign_add(1)
        step_in_epoch.assign(0)
        checkpoint_manager.save()
        if not _is_chief(task_type, task_id):
            tf.io.gfile.rmtree(write_checkpoint_dir)
    return multi_worker_model, losses, accuracies


@client_case(
    "TF tutorial distribute/multi_worker_with_ctl: compute_average_loss, "
    "distribute_datasets_from_function, CheckpointManager, resume",
    workers=WORKERS,
)
def tf_multi_worker_custom_loop(strategy, workdir):
    model, losses, accuracies = _train(strategy, workdir, num_epochs=2)
    _barrier(strategy)  # the chief's checkpoint is written before anyone reads it
    # The script runs again (as after a restart) and resumes from the checkpoint.
    resumed, resumed_losses, _ = _train(strategy, workdir, num_epochs=EPOCHS)
    return {
        "weights_first_run": model.get_weights(),
        "loss": losses,
        "accuracy": accuracies,
        "weights": resumed.get_weights(),
        "resumed_loss": resumed_losses,
    }
