"""Small offline data for the client cases: scikit-learn's digits, no downloads.

The tutorials read MNIST from TFDS; the digits (8x8, 10 classes, bundled with
scikit-learn) stand in for it at a size where every case trains in seconds.
"""

from __future__ import annotations

import functools

TRAIN_SIZE = 512
TEST_SIZE = 200  # not a multiple of the global batch: evaluation sees a partial batch


@functools.lru_cache(maxsize=1)
def digits():
    """`((x_train, y_train), (x_test, y_test))`: uint8 images 0..16 of (8, 8, 1)."""
    import numpy as np
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    images = images.reshape(-1, 8, 8, 1).astype(np.uint8)
    labels = labels.astype(np.int64)
    end = TRAIN_SIZE + TEST_SIZE
    return (images[:TRAIN_SIZE], labels[:TRAIN_SIZE]), (
        images[TRAIN_SIZE:end],
        labels[TRAIN_SIZE:end],
    )


def scale(image, label):
    """The tutorials' `scale`: uint8 pixels to float32 in [0, 1]."""
    import tensorflow as tf

    return tf.cast(image, tf.float32) / 16.0, label


def flat_digits():
    """The digits as float32 vectors of 64, for the keras-io MLP guides."""
    (x, y), (xt, yt) = digits()
    return (
        (x.reshape(-1, 64) / 16.0).astype("float32"),
        y,
    ), ((xt.reshape(-1, 64) / 16.0).astype("float32"), yt)
