"""TensorFlow's "Save and load a model using a distribution strategy" tutorial
(tensorflow.org/tutorials/distribute/save_and_load), in its Keras 3 form.

A model trained under the strategy is saved with the Keras API (`model.save`,
`save_weights`) and loaded without a strategy and in a strategy's scope, where it
keeps training; and exported as a SavedModel (`model.export`), loaded with the
low-level `tf.saved_model.load` in the scope and called through `strategy.run` on a
distributed dataset.
"""

import os

from tests.clients._data import digits, scale
from tests.clients._registry import client_case

GLOBAL_BATCH = 64


def _get_model():
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
        optimizer=keras.optimizers.Adam(0.01),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


def _datasets():
    import tensorflow as tf

    (x, y), (x_test, y_test) = digits()
    train = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .map(scale)
        .shuffle(len(x), seed=5)
        .batch(GLOBAL_BATCH)
    )
    test = (
        tf.data.Dataset.from_tensor_slices((x_test, y_test))
        .map(scale)
        .batch(GLOBAL_BATCH)
    )
    return train, test


@client_case(
    "TF tutorial distribute/save_and_load: model.save / save_weights, load "
    "without a strategy and in the scope, keep training"
)
def tf_save_and_load_keras(strategy, workdir):
    import keras

    train_dataset, eval_dataset = _datasets()
    with strategy.scope():
        model = _get_model()
    model.fit(train_dataset, epochs=2, verbose=0)

    keras_path = os.path.join(workdir, "model.keras")
    weights_path = os.path.join(workdir, "model.weights.h5")
    model.save(keras_path)
    model.save_weights(weights_path)

    restored = keras.models.load_model(keras_path)
    predictions = restored.predict(eval_dataset, verbose=0)
    with strategy.scope():
        restored_in_scope = keras.models.load_model(keras_path)
        from_weights = _get_model()
    from_weights.load_weights(weights_path)
    history = restored_in_scope.fit(train_dataset, epochs=1, verbose=0)
    return {
        "predictions": predictions,
        "weights_file": from_weights.get_weights(),
        "weights_after_more_training": restored_in_scope.get_weights(),
        "loss_after_reload": history.history["loss"],
    }


@client_case(
    "TF tutorial distribute/save_and_load: model.export, tf.saved_model.load in "
    "the scope, inference through strategy.run"
)
def tf_save_and_load_saved_model(strategy, workdir):
    import tensorflow as tf

    train_dataset, eval_dataset = _datasets()
    with strategy.scope():
        model = _get_model()
    model.fit(train_dataset, epochs=1, verbose=0)
    path = os.path.join(workdir, "saved_model")
    model.export(path, verbose=False)

    with strategy.scope():
        loaded = tf.saved_model.load(path)
        inference_func = loaded.signatures["serving_default"]
    images = eval_dataset.map(lambda image, label: image)
    outputs = []
    for batch in strategy.experimental_distribute_dataset(images):
        result = strategy.run(inference_func, args=(batch,))
        (logits,) = result.values()
        outputs.append(strategy.gather(logits, axis=0))
    return {"predictions": tf.concat(outputs, axis=0)}
