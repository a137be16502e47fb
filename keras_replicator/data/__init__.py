"""Input data: bundled digits, the user's images, `image_pipeline`, tf.data service."""

from keras_replicator.data import service
from keras_replicator.data.digits import ReplicatorDigits, prepare_digits
from keras_replicator.data.image_classification import (
    ImageClassificationData,
    load_image_classification,
)
from keras_replicator.data.image_pipeline import image_pipeline
from keras_replicator.data.service import (
    LocalDataService,
    service_address,
    start_local_service,
)
from keras_replicator.data.skipped_records import SkippedRecords
from keras_replicator.data.tfrecord_writer import digit_images, write_image_tfrecords
from keras_replicator.data.throughput import PipelineThroughput, measure_pipeline

__all__ = [
    "ImageClassificationData",
    "LocalDataService",
    "PipelineThroughput",
    "ReplicatorDigits",
    "SkippedRecords",
    "digit_images",
    "image_pipeline",
    "load_image_classification",
    "measure_pipeline",
    "prepare_digits",
    "service",
    "service_address",
    "start_local_service",
    "write_image_tfrecords",
]
