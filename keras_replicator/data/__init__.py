"""Datasets without downloads: bundled digits as local TFDS, and the user's images."""

from keras_replicator.data.digits import ReplicatorDigits, prepare_digits
from keras_replicator.data.image_classification import (
    ImageClassificationData,
    load_image_classification,
)
from keras_replicator.data.image_pipeline import image_pipeline
from keras_replicator.data.tfrecord_writer import digit_images, write_image_tfrecords
from keras_replicator.data.throughput import PipelineThroughput, measure_pipeline

__all__ = [
    "ImageClassificationData",
    "PipelineThroughput",
    "ReplicatorDigits",
    "digit_images",
    "image_pipeline",
    "load_image_classification",
    "measure_pipeline",
    "prepare_digits",
    "write_image_tfrecords",
]
