"""TensorFlow's "Distributed training with Keras" tutorial (tensorflow.org/tutorials/
distribute/keras), as a Keras 3 user writes it.

The model is built and compiled in the strategy's scope; `fit` runs with the
tutorial's callbacks (TensorBoard, ModelCheckpoint of the weights each epoch, a
LearningRateScheduler with a step decay and a callback printing the rate); then the
latest checkpoint is restored and evaluated, and the model is saved and reloaded
without a strategy and in the strategy's scope.
"""

import os

from tests.clients._data import digits, scale
from tests.clients._registry import client_case

GLOBAL_BATCH = 64
EPOCHS = 3


def _decay(epoch):
    return 1e-2 if epoch < 2 else 1e-3


def _build_and_compile():
    import keras

    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.Adam(),
        metrics=["accuracy"],
    )
    return model


@client_case(
    "TF tutorial distribute/keras: fit with TensorBoard, ModelCheckpoint, "
    "LearningRateScheduler; restore, evaluate, save and reload"
)
def tf_keras_fit_with_callbacks(strategy, workdir):
    import keras
    import tensorflow as tf

    (x, y), (x_test, y_test) = digits()
    train_dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .map(scale)
        .cache()
        .shuffle(len(x), seed=7)
        .batch(GLOBAL_BATCH)
    )
    eval_dataset = (
        tf.data.Dataset.from_tensor_slices((x_test, y_test))
        .map(scale)
        .batch(GLOBAL_BATCH)
    )
    with strategy.scope():
        model = _build_and_compile()

    checkpoint_dir = os.path.join(workdir, "training_checkpoints")
    checkpoint_path = os.path.join(checkpoint_dir, "ckpt_{epoch}.weights.h5")
    learning_rates = []

    class PrintLR(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            rate = float(self.model.optimizer.learning_rate.numpy())
            learning_rates.append(rate)
            print(f"Learning rate for epoch {epoch + 1} is {rate}")

    callbacks = [
        keras.callbacks.TensorBoard(log_dir=os.path.join(workdir, "logs")),
        keras.callbacks.ModelCheckpoint(
            filepath=checkpoint_path, save_weights_only=True
        ),
        keras.callbacks.LearningRateScheduler(_decay),
        PrintLR(),
    ]
    history = model.fit(train_dataset, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    trained = model.get_weights()

    model.load_weights(checkpoint_path.format(epoch=EPOCHS))
    evaluation = model.evaluate(eval_dataset, verbose=0)

    path = os.path.join(workdir, "my_model.keras")
    model.save(path)
    unreplicated_model = keras.models.load_model(path)
    unreplicated = unreplicated_model.evaluate(eval_dataset, verbose=0)
    with strategy.scope():
        replicated_model = keras.models.load_model(path)
    replicated = replicated_model.evaluate(eval_dataset, verbose=0)
    return {
        "weights": trained,
        "loss": history.history["loss"],
        "accuracy": history.history["accuracy"],
        "learning_rates": learning_rates,
        "evaluate": evaluation,
        "evaluate_reloaded": unreplicated,
        "evaluate_reloaded_in_scope": replicated,
    }
