"""The keras-io guide "Multi-GPU distributed training with TensorFlow"
(keras.io/guides/distributed_training_with_tensorflow).

A functional MLP compiled in the scope, `make_or_restore_model` loading the newest
`.keras` checkpoint in the scope if there is one, `ModelCheckpoint` every epoch, and
the guide's two calls of `run_training(epochs=1)`: the second restores and goes on.
"""

import os

from tests.clients._data import flat_digits
from tests.clients._registry import client_case

GLOBAL_BATCH = 64


def _get_compiled_model():
    import keras

    inputs = keras.Input(shape=(64,))
    x = keras.layers.Dense(64, activation="relu")(inputs)
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


def _get_dataset():
    import tensorflow as tf

    (x, y), (x_test, y_test) = flat_digits()
    num_val = 128
    return (
        tf.data.Dataset.from_tensor_slices((x[num_val:], y[num_val:])).batch(
            GLOBAL_BATCH
        ),
        tf.data.Dataset.from_tensor_slices((x[:num_val], y[:num_val])).batch(
            GLOBAL_BATCH
        ),
        tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(GLOBAL_BATCH),
    )


def _make_or_restore_model(checkpoint_dir):
    import keras

    checkpoints = [os.path.join(checkpoint_dir, n) for n in os.listdir(checkpoint_dir)]
    if checkpoints:
        latest_checkpoint = max(checkpoints, key=os.path.getmtime)
        return keras.models.load_model(latest_checkpoint)
    return _get_compiled_model()


@client_case(
    "keras-io guide distributed_training_with_tensorflow: make_or_restore_model, "
    "ModelCheckpoint(.keras), run_training twice"
)
def kerasio_distributed_training(strategy, workdir):
    import keras

    checkpoint_dir = os.path.join(workdir, "ckpt")
    os.makedirs(checkpoint_dir, exist_ok=True)
    train_dataset, val_dataset, test_dataset = _get_dataset()
    histories = []

    def run_training(epochs=1):
        with strategy.scope():
            model = _make_or_restore_model(checkpoint_dir)
        callbacks = [
            keras.callbacks.ModelCheckpoint(
                filepath=os.path.join(checkpoint_dir, "ckpt-{epoch}.keras"),
                save_freq="epoch",
            )
        ]
        history = model.fit(
            train_dataset,
            epochs=epochs,
            callbacks=callbacks,
            validation_data=val_dataset,
            verbose=0,
        )
        histories.append(history.history)
        return model

    run_training(epochs=1)
    model = run_training(epochs=1)
    return {
        "weights": model.get_weights(),
        "histories": [
            {
                key: h[key]
                for key in ("loss", "val_loss", "val_sparse_categorical_accuracy")
            }
            for h in histories
        ],
        "test": model.evaluate(test_dataset, verbose=0),
    }
