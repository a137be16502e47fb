"""Datasets without downloads: bundled digits as local TFDS, and the user's images."""

from keras_replicator.data.digits import ReplicatorDigits, prepare_digits
from keras_replicator.data.image_classification import (
    ImageClassificationData,
    load_image_classification,
)

__all__ = [
    "ImageClassificationData",
    "ReplicatorDigits",
    "load_image_classification",
    "prepare_digits",
]
