"""A small ResNet for small images, with synchronized batch norm over replica groups.

`keras.applications` has only the ImageNet-sized ResNets (ResNet-50 and up: 25M
parameters, 224x224 inputs), far too big for the CPU demo and the CI notebooks. This
is ResNet v1 in the CIFAR form of He et al. (2016): a 3x3 stem, three stages of
basic blocks (two 3x3 convolutions and a shortcut) with widths doubling and
resolution halving, global average pooling, and a linear classifier: `6n + 2` layers
for `n` blocks per stage. Every normalisation layer is
`keras_replicator.layers.SyncBatchNormalization`, so batch statistics are computed
over `bn_group_size` replicas (Ying et al. 2018), and the residual branch's last
normalisation starts at zero (Goyal et al. 2017), which helps large-batch training.
"""

from __future__ import annotations

import keras

from keras_replicator._arguments import check_int
from keras_replicator.layers import SyncBatchNormalization


def small_resnet(
    input_shape,
    num_classes: int,
    *,
    widths=(16, 32, 64),
    blocks_per_stage: int = 1,
    bn_group_size: int | None = None,
    weight_decay: float = 0.0,
    name: str = "small_resnet",
) -> keras.Model:
    """Builds a CIFAR-style ResNet v1 whose batch norm is synchronized over replicas.

    Args:
        input_shape: `(height, width, channels)` of the images.
        num_classes: Number of classes; the model outputs logits.
        widths: Filters of the three stages. Defaults to `(16, 32, 64)`.
        blocks_per_stage: Basic blocks per stage (`n`; depth `6n + 2`). Defaults to
            `1` (ResNet-8).
        bn_group_size: Replicas whose batch statistics are pooled by each
            `SyncBatchNormalization` (`None`: all replicas; `1`: each its own).
            Defaults to `None`.
        weight_decay: L2 factor on convolution and dense kernels (as a Keras
            regularizer; leave `0.0` when the optimizer decays weights). Defaults
            to `0.0`.
        name: The model's name.

    Returns:
        An uncompiled functional `keras.Model`.

    Example:
    >>> import keras_replicator as kr
    >>> model = kr.models.small_resnet((16, 16, 1), 10, bn_group_size=2)
    >>> model.output_shape
    (None, 10)
    """
    check_int("num_classes", num_classes, minimum=2)
    check_int("blocks_per_stage", blocks_per_stage)
    widths = tuple(widths)
    if not widths or not all(isinstance(w, int) and w > 0 for w in widths):
        raise ValueError(
            f"`widths` must be positive integers. Received: widths={widths!r}."
        )
    regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None

    def conv(filters, kernel, strides=1):
        return keras.layers.Conv2D(
            filters,
            kernel,
            strides=strides,
            padding="same",
            use_bias=False,
            kernel_initializer="he_normal",
            kernel_regularizer=regularizer,
        )

    def norm(zero=False):
        return SyncBatchNormalization(
            group_size=bn_group_size,
            momentum=0.9,
            gamma_initializer="zeros" if zero else "ones",
        )

    inputs = keras.Input(input_shape)
    x = keras.layers.ReLU()(norm()(conv(widths[0], 3)(inputs)))
    for stage, filters in enumerate(widths):
        for block in range(blocks_per_stage):
            strides = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            if strides != 1 or shortcut.shape[-1] != filters:
                shortcut = norm()(conv(filters, 1, strides)(x))
            y = keras.layers.ReLU()(norm()(conv(filters, 3, strides)(x)))
            y = norm(zero=True)(conv(filters, 3)(y))
            x = keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(
        num_classes, kernel_regularizer=regularizer, name="logits"
    )(x)
    return keras.Model(inputs, outputs, name=name)
