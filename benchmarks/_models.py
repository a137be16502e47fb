"""The models several benchmarks time, and the one way they are compiled.

`allreduce --fit`, `step_overhead`, `weight_update_sharding` and `machines --fit`
train the same MLP (6.3M parameters, 25 MB of gradients a step) and ResNet-20, so
their numbers can be read side by side. Every timed `fit` trains a classifier whose
last layer gives logits, built and compiled under the strategy's scope the same way.
"""

from __future__ import annotations


def compiled(keras, strategy, build, optimizer="sgd", metrics=None):
    """`build(keras)` made under `strategy`, compiled with crossentropy on logits.

    Args:
        keras: The `keras` module (imported by the caller, after its thread setup).
        strategy: The `tf.distribute.Strategy` whose scope holds the variables.
        build: Makes the uncompiled model from `keras`.
        optimizer: A name `compile` resolves, or a function making the optimizer,
            called inside the scope (a Keras optimizer binds to the strategy in
            scope when it is made). Defaults to `"sgd"`.
        metrics: What `compile` gets. Defaults to `None` (no metrics).
    """
    with strategy.scope():
        model = build(keras)
        model.compile(
            optimizer() if callable(optimizer) else optimizer,
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=metrics,
        )
    return model


def build_model(keras, name: str):
    """The model `name` names, uncompiled.

    `mlp` is 784-2048-2048-256-10, `small_mlp` 784-2048-2048-1024-10, `resnet20`
    He et al.'s CIFAR ResNet-20.
    """
    if name in ("mlp", "small_mlp"):
        widths = (2048, 2048, 256) if name == "mlp" else (2048, 2048, 1024)
        return keras.Sequential(
            [keras.Input((784,))]
            + [keras.layers.Dense(w, activation="relu") for w in widths]
            + [keras.layers.Dense(10)]
        )
    return resnet20(keras)


def resnet20(keras):
    """He et al.'s CIFAR ResNet-20: 3 stages of 3 basic blocks, 16/32/64 filters."""
    inputs = keras.Input((32, 32, 3))

    def conv_bn(x, filters, strides=1, relu=True):
        x = keras.layers.Conv2D(filters, 3, strides, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        return keras.layers.ReLU()(x) if relu else x

    x = conv_bn(inputs, 16)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            strides = 2 if stage and not block else 1
            shortcut = x
            y = conv_bn(x, filters, strides)
            y = conv_bn(y, filters, relu=False)
            if strides != 1:
                shortcut = keras.layers.Conv2D(filters, 1, strides, use_bias=False)(x)
            x = keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))
