"""TensorFlow's "Multi-worker training with Keras" tutorial (tensorflow.org/tutorials/
distribute/multi_worker_with_keras), in 2 worker processes.

Every worker runs the same script: a repeated, shuffled dataset at the global batch,
the CNN built and compiled in the scope, `fit` with `steps_per_epoch`; Keras' own
`ModelCheckpoint` and `BackupAndRestore` given the same path on every worker (a
training interrupted after epoch 2 and resumed, as after a worker's restart); the
tutorial's `write_filepath` idiom (the chief writes the real path, the others a
temporary one they delete) for `model.save` and `tf.train.CheckpointManager`; and
`model.save` / `save_weights` called on every worker with the same path.

The one-device reference runs the same code in one process without `TF_CONFIG`.
"""

import os

from tests.clients._data import digits, scale
from tests.clients._registry import client_case

WORKERS = 2
GLOBAL_BATCH = 64
STEPS_PER_EPOCH = 4


def _mnist_dataset(batch_size):
    import tensorflow as tf

    (x, y), _ = digits()
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .map(scale)
        .shuffle(len(x), seed=11)
        .repeat()
        .batch(batch_size)
    )


def _build_and_compile_cnn_model():
    import keras

    model = keras.Sequential(
        [
            keras.Input(shape=(8, 8, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.SGD(learning_rate=0.1),
        metrics=["accuracy"],
    )
    return model


def _is_chief(task_type, task_id):
    # No cluster (one device): this process is the chief.
    return task_type is None or (task_type == "worker" and task_id == 0)


def _get_temp_dir(dirpath, task_id):
    import tensorflow as tf

    temp_dir = os.path.join(dirpath, f"workertemp_{task_id}")
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def _write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


def _task(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return None, None
    return resolver.task_type, resolver.task_id


@client_case(
    "TF tutorial distribute/multi_worker_with_keras: fit on a repeated dataset "
    "with steps_per_epoch",
    workers=WORKERS,
)
def tf_multi_worker_fit(strategy, workdir):
    dataset = _mnist_dataset(GLOBAL_BATCH)
    with strategy.scope():
        model = _build_and_compile_cnn_model()
    history = model.fit(dataset, epochs=3, steps_per_epoch=STEPS_PER_EPOCH, verbose=0)
    return {"weights": model.get_weights(), "loss": history.history["loss"]}


@client_case(
    "TF tutorial distribute/multi_worker_with_keras: keras.callbacks."
    "ModelCheckpoint, same path on every worker",
    workers=WORKERS,
)
def tf_multi_worker_model_checkpoint(strategy, workdir):
    import keras

    dataset = _mnist_dataset(GLOBAL_BATCH)
    with strategy.scope():
        model = _build_and_compile_cnn_model()
    weights_path = os.path.join(workdir, "ckpt", "weights.{epoch:02d}.weights.h5")
    model_path = os.path.join(workdir, "ckpt", "model.keras")
    callbacks = [
        keras.callbacks.ModelCheckpoint(filepath=weights_path, save_weights_only=True),
        keras.callbacks.ModelCheckpoint(filepath=model_path),
    ]
    model.fit(
        dataset,
        epochs=2,
        steps_per_epoch=STEPS_PER_EPOCH,
        callbacks=callbacks,
        verbose=0,
    )
    results = {"weights": model.get_weights()}
    if _is_chief(*_task(strategy)):
        restored = _build_and_compile_cnn_model()
        restored.load_weights(weights_path.format(epoch=2))
        results["checkpoint_weights"] = restored.get_weights()
        results["checkpoint_model"] = keras.models.load_model(model_path).get_weights()
    return results


@client_case(
    "TF tutorial distribute/multi_worker_with_keras: keras.callbacks."
    "BackupAndRestore, interrupted after epoch 2 and resumed",
    workers=WORKERS,
)
def tf_multi_worker_backup_and_restore(strategy, workdir):
    import keras

    class Interruption(Exception):
        pass

    class InterruptAfterEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise Interruption(f"simulated failure after epoch {epoch + 1}")

    backup = keras.callbacks.BackupAndRestore(
        backup_dir=os.path.join(workdir, "backup")
    )
    with strategy.scope():
        model = _build_and_compile_cnn_model()
    try:
        model.fit(
            _mnist_dataset(GLOBAL_BATCH),
            epochs=4,
            steps_per_epoch=STEPS_PER_EPOCH,
            callbacks=[backup, InterruptAfterEpoch()],
            verbose=0,
        )
    except Interruption:
        pass
    # The worker "restarts": a fresh model, and fit resumes from the backup.
    with strategy.scope():
        model = _build_and_compile_cnn_model()
    history = model.fit(
        _mnist_dataset(GLOBAL_BATCH),
        epochs=4,
        steps_per_epoch=STEPS_PER_EPOCH,
        callbacks=[backup],
        verbose=0,
    )
    return {"weights": model.get_weights(), "resumed_loss": history.history["loss"]}


@client_case(
    "TF tutorial distribute/multi_worker_with_keras: write_filepath idiom for "
    "model.save and CheckpointManager, then reload and go on",
    workers=WORKERS,
)
def tf_multi_worker_save_write_filepath(strategy, workdir):
    import keras
    import tensorflow as tf

    dataset = _mnist_dataset(GLOBAL_BATCH)
    with strategy.scope():
        multi_worker_model = _build_and_compile_cnn_model()
    multi_worker_model.fit(
        dataset, epochs=2, steps_per_epoch=STEPS_PER_EPOCH, verbose=0
    )
    task_type, task_id = _task(strategy)

    model_path = os.path.join(workdir, "keras-model.keras")
    write_model_path = _write_filepath(model_path, task_type, task_id)
    multi_worker_model.save(write_model_path)
    if not _is_chief(task_type, task_id):
        tf.io.gfile.rmtree(os.path.dirname(write_model_path))

    checkpoint_dir = os.path.join(workdir, "ckpt")
    checkpoint = tf.train.Checkpoint(model=multi_worker_model)
    write_checkpoint_dir = _write_filepath(checkpoint_dir, task_type, task_id)
    manager = tf.train.CheckpointManager(
        checkpoint, directory=write_checkpoint_dir, max_to_keep=1
    )
    manager.save()
    if not _is_chief(task_type, task_id):
        tf.io.gfile.rmtree(write_checkpoint_dir)
    _barrier(strategy)  # the chief's files are complete before anyone reads them

    loaded_model = keras.models.load_model(model_path)
    loaded_weights = loaded_model.get_weights()
    checkpoint.restore(tf.train.latest_checkpoint(checkpoint_dir))
    multi_worker_model.fit(
        dataset, epochs=1, steps_per_epoch=STEPS_PER_EPOCH, verbose=0
    )
    return {
        "loaded_weights": loaded_weights,
        "weights_after_restore_and_fit": multi_worker_model.get_weights(),
    }


@client_case(
    "Keras model.save / save_weights called on every worker with the same path",
    workers=WORKERS,
)
def tf_multi_worker_save_on_every_worker(strategy, workdir):
    import keras

    with strategy.scope():
        model = _build_and_compile_cnn_model()
    model.fit(
        _mnist_dataset(GLOBAL_BATCH),
        epochs=2,
        steps_per_epoch=STEPS_PER_EPOCH,
        verbose=0,
    )
    model_path = os.path.join(workdir, "model.keras")
    weights_path = os.path.join(workdir, "model.weights.h5")
    model.save(model_path)
    model.save_weights(weights_path)
    _barrier(strategy)
    restored = _build_and_compile_cnn_model()
    restored.load_weights(weights_path)
    return {
        "weights": model.get_weights(),
        "saved_model_weights": keras.models.load_model(model_path).get_weights(),
        "saved_weights": restored.get_weights(),
    }


def _barrier(strategy):
    """Waits for every worker: an all-reduce of a scalar."""
    import tensorflow as tf

    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
