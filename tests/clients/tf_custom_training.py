"""TensorFlow's "Custom training with tf.distribute.Strategy" tutorial (tensorflow.org/
tutorials/distribute/custom_training), and a Keras loss object summed over replicas.

The tutorial's contract: each replica divides its per-example losses by the global
batch (`tf.nn.compute_average_loss`, regularization through
`tf.nn.scale_regularization_loss`) and the optimizer *sums* the replicas' gradients.
The optimizer is created in the scope and builds its slots lazily, at the first
`apply_gradients` inside `strategy.run` in a `tf.function`. The loss is reported
with `strategy.reduce("SUM", ...)`; the model is saved with `tf.train.Checkpoint` and
restored into a model outside any strategy.
"""

import os

from tests.clients._data import digits, scale
from tests.clients._registry import client_case

GLOBAL_BATCH = 64
EPOCHS = 3


def _create_model():
    import keras

    regularizer = keras.regularizers.L2(1e-4)
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(
                8, 3, activation="relu", kernel_regularizer=regularizer
            ),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu", kernel_regularizer=regularizer),
            keras.layers.Dense(10, kernel_regularizer=regularizer),
        ]
    )


def _datasets():
    import tensorflow as tf

    (x, y), (x_test, y_test) = digits()
    train = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .map(scale)
        .shuffle(len(x), seed=3)
        .batch(GLOBAL_BATCH)
    )
    test = (
        tf.data.Dataset.from_tensor_slices((x_test, y_test))
        .map(scale)
        .batch(GLOBAL_BATCH)
    )
    return train, test


def _training_objects(strategy):
    """What the tutorial creates in the scope: model, loss, metrics, optimizer."""
    import keras
    import tensorflow as tf

    with strategy.scope():
        loss_object = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=None
        )

        def compute_loss(labels, predictions, model_losses):
            per_example_loss = loss_object(labels, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss)
            if model_losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
            return loss

        test_loss = keras.metrics.Mean(name="test_loss")
        train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
        test_accuracy = keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
        model = _create_model()
        optimizer = keras.optimizers.Adam(learning_rate=0.01)
        checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)
    return {
        "loss_object": loss_object,
        "compute_loss": compute_loss,
        "test_loss": test_loss,
        "train_accuracy": train_accuracy,
        "test_accuracy": test_accuracy,
        "model": model,
        "optimizer": optimizer,
        "checkpoint": checkpoint,
    }


def _steps(strategy, objects):
    import tensorflow as tf

    model, optimizer = objects["model"], objects["optimizer"]

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = objects["compute_loss"](labels, predictions, model.losses)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        objects["train_accuracy"].update_state(labels, predictions)
        return loss

    def test_step(inputs):
        images, labels = inputs
        predictions = model(images, training=False)
        objects["test_loss"].update_state(objects["loss_object"](labels, predictions))
        objects["test_accuracy"].update_state(labels, predictions)

    @tf.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None
        )

    @tf.function
    def distributed_test_step(dataset_inputs):
        return strategy.run(test_step, args=(dataset_inputs,))

    return distributed_train_step, distributed_test_step


@client_case(
    "TF tutorial distribute/custom_training: compute_average_loss, optimizer "
    "built lazily in strategy.run, reduce SUM, tf.train.Checkpoint"
)
def tf_custom_training_loop(strategy, workdir):
    import keras
    import tensorflow as tf

    train_dataset, test_dataset = _datasets()
    train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
    test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)
    objects = _training_objects(strategy)
    distributed_train_step, distributed_test_step = _steps(strategy, objects)
    checkpoint_prefix = os.path.join(workdir, "training_checkpoints", "ckpt")

    history = {"train_loss": [], "train_accuracy": [], "test_loss": []}
    history["test_accuracy"] = []
    for epoch in range(EPOCHS):
        total_loss = 0.0
        num_batches = 0
        for batch in train_dist_dataset:
            total_loss += distributed_train_step(batch)
            num_batches += 1
        train_loss = total_loss / num_batches
        for batch in test_dist_dataset:
            distributed_test_step(batch)
        if epoch % 2 == 0:
            objects["checkpoint"].save(checkpoint_prefix)
        history["train_loss"].append(float(train_loss))
        for name in ("train_accuracy", "test_loss", "test_accuracy"):
            history[name].append(float(objects[name].result()))
            objects[name].reset_state()

    # Restore the latest checkpoint into a model without a strategy, and test it.
    eval_accuracy = keras.metrics.SparseCategoricalAccuracy(name="eval_accuracy")
    new_model = _create_model()
    new_optimizer = keras.optimizers.Adam()

    @tf.function
    def eval_step(images, labels):
        eval_accuracy.update_state(labels, new_model(images, training=False))

    checkpoint = tf.train.Checkpoint(optimizer=new_optimizer, model=new_model)
    checkpoint.restore(
        tf.train.latest_checkpoint(os.path.dirname(checkpoint_prefix))
    ).expect_partial()
    for images, labels in test_dataset:
        eval_step(images, labels)
    return {
        "weights": objects["model"].get_weights(),
        **history,
        "restored_weights": new_model.get_weights(),
        "restored_accuracy": float(eval_accuracy.result()),
    }


@client_case(
    "TF tutorial distribute/custom_training: iterating with iter/next and "
    "inside a tf.function"
)
def tf_custom_training_iterators(strategy, workdir):
    import tensorflow as tf

    train_dataset, _ = _datasets()
    objects = _training_objects(strategy)
    distributed_train_step, _ = _steps(strategy, objects)
    train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
    steps_per_epoch = 8

    # Outside a tf.function, with an iterator.
    losses = []
    train_iter = iter(train_dist_dataset)
    for _ in range(steps_per_epoch):
        losses.append(float(distributed_train_step(next(train_iter))))

    # The whole epoch inside a tf.function.
    train_step = distributed_train_step.python_function

    @tf.function
    def distributed_train_epoch(dataset):
        total_loss = 0.0
        num_batches = 0.0
        for batch in dataset:
            total_loss += train_step(batch)
            num_batches += 1
        return total_loss / num_batches

    epoch_loss = distributed_train_epoch(train_dist_dataset)
    return {
        "weights": objects["model"].get_weights(),
        "step_losses": losses,
        "epoch_loss": float(epoch_loss),
    }


@client_case(
    "Keras loss object (default reduction) in strategy.run, summed with "
    "strategy.reduce('SUM'): the global-batch mean"
)
def keras_loss_object_reduce_sum(strategy, workdir):
    import keras
    import tensorflow as tf

    train_dataset, _ = _datasets()
    with strategy.scope():
        model = _create_model()
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        optimizer = keras.optimizers.SGD(learning_rate=0.1)
        optimizer.build(model.trainable_variables)

    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_step(batch):
        per_replica = strategy.run(step, args=batch)
        return strategy.reduce("SUM", per_replica, axis=None)

    losses = [
        float(distributed_step(batch))
        for batch in strategy.experimental_distribute_dataset(train_dataset)
    ]
    return {"weights": model.get_weights(), "losses": losses}
