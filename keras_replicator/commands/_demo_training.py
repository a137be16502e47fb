"""The demo's training: the model, its input pipeline and one timed `fit` per run.

Both runs (N replicas and one device) are built by the same function from the same
initial weights and fed the same shuffled global batches, so any difference between
them is the strategy's. Everything TensorFlow is imported inside the functions:
`keras-replicator --help` must not pay for importing it.
"""

from __future__ import annotations

import statistics
import time

# LARS trust coefficient, with the learning rate at SGD scale (biases and batch-norm
# parameters are not adapted and train at the plain rate). Picked on a validation
# split carved from the training data: 0.02 gave 97.2% after 12 epochs on digits,
# 0.01 and 0.05 less.
EETA = 0.02


def build_model(data, args, peak, steps_per_epoch):
    """A compiled ResNet-8 with LARS and warmup, in the current strategy's scope."""
    import keras

    import keras_replicator as kr

    model = kr.models.small_resnet(
        data.image_shape, data.num_classes, bn_group_size=args.bn_group_size
    )
    schedule = kr.schedules.PolynomialDecayWithWarmup(
        peak,
        warmup_steps=max(1, round(args.warmup_epochs * steps_per_epoch)),
        decay_steps=args.epochs * steps_per_epoch,
        end_learning_rate=0.0,
    )
    model.compile(
        optimizer=kr.optimizers.LARS(
            schedule, momentum=0.9, weight_decay=5e-4, eeta=EETA
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def batches(data, args, training, dtype="float32"):
    """Global batches for training (an endless stream) or evaluation (one pass).

    Data with files (`data.pipeline_source`: digits and TFDS) is read by
    `kr.data.image_pipeline`: compressed records cached, shuffled over the whole
    training set with `args.seed`, decoded and resized in parallel, prefetched. The
    demo's images are small and centered, so training keeps whole images
    (`crop_area_range=(1, 1)`, no flips) and evaluation uses no center crop; order
    is deterministic so every run sees the same global batches. An image folder's
    train/test split exists only in the loader, and non-square images would be
    squashed in training but center-cropped in evaluation, so those are batched
    here from the loader's tensors.
    """
    import tensorflow as tf

    height, width, channels = data.image_shape
    stored = data.stored_image_shape or (None, None)
    # Whole-image crops and a full "center crop" agree only for square images.
    square = stored[0] is not None and stored[0] == stored[1] and height == width
    if data.pipeline_source is not None and square and channels in (1, 3):
        from keras_replicator.data import image_pipeline

        dataset = image_pipeline(
            data.pipeline_source,
            batch_size=args.batch_size,
            image_size=height,
            training=training,
            channels=channels,
            seed=args.seed,
            deterministic=True,
            shuffle_buffer=data.train_size,
            crop_area_range=(1.0, 1.0),
            flip=False,
            central_fraction=1.0,
        )
    else:
        dataset = (data.train if training else data.test).cache()
        if training:
            dataset = dataset.shuffle(data.train_size, seed=args.seed).repeat()
        dataset = dataset.batch(args.batch_size, drop_remainder=training)
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    if dtype != "float32":
        dataset = dataset.map(lambda image, label: (tf.cast(image, dtype), label))
    return dataset


def train_run(label, strategy, build, initial, train, test, args, steps_per_epoch):
    """Trains a fresh model on `strategy` from `initial` weights; returns its numbers.

    `build()` makes the compiled model, `train()` and `test()` the datasets.
    """
    import keras_replicator as kr

    print(f"\n== {label} ({type(strategy).__name__}) ==")
    with strategy.scope():
        model = build()
    model.set_weights(initial)
    throughput = kr.callbacks.Throughput(
        every_n_steps=steps_per_epoch, batch_size=args.batch_size
    )
    start = time.perf_counter()
    epoch_weights = epoch_weights_callback()
    history = model.fit(
        train(),
        epochs=args.epochs,
        steps_per_epoch=steps_per_epoch,
        validation_data=test(),
        callbacks=[kr.callbacks.CrossReplicaMetrics(), throughput, epoch_weights],
        verbose=1 if kr.is_chief() else 0,
    )
    seconds = time.perf_counter() - start
    loss, accuracy = model.evaluate(test(), verbose=0)
    speeds = history.history.get("examples_per_second", [])
    result = {
        "replicas": strategy.num_replicas_in_sync,
        "strategy": type(strategy).__name__,
        "test_accuracy": float(accuracy),
        "test_loss": float(loss),
        # The first epoch includes tracing; report the steady state.
        "examples_per_second": float(statistics.median(speeds[1:] or speeds)),
        "seconds": seconds,
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "weights": model.get_weights(),
        "epoch_weights": epoch_weights.weights,
    }
    print(
        f"{label}: test accuracy {accuracy:.4f}, "
        f"{result['examples_per_second']:,.0f} examples/s, {seconds:.1f} s"
    )
    return result


def epoch_weights_callback(every_step=False):
    """A Keras callback keeping a copy of the weights after every epoch (or step)."""
    import keras

    class EpochWeights(keras.callbacks.Callback):
        """Keeps a copy of the model's weights after every epoch (or step)."""

        def __init__(self):
            super().__init__()
            self.weights = []

        def on_train_batch_end(self, batch, logs=None):
            if every_step:
                self.weights.append(self.model.get_weights())

        def on_epoch_end(self, epoch, logs=None):
            if not every_step:
                self.weights.append(self.model.get_weights())

    return EpochWeights()
