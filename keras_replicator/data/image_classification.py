"""Image-classification data for the demo and notebooks: bundled digits or the user's.

One loader for the three places a user's images live -- a TFDS dataset (by name or by
its prepared directory), or a folder with one subfolder per class -- returning
unbatched `(image, label)` datasets with images as float32 in [0, 1]. Batching,
shuffling and distribution stay with the caller (`model.fit` distributes a batched
`tf.data.Dataset` itself, sharding by file across workers). No network access is
attempted: a TFDS dataset must already be prepared in `data_dir`.
"""

from __future__ import annotations

import dataclasses
import os

import tensorflow as tf
import tensorflow_datasets as tfds

from keras_replicator._arguments import check_int
from keras_replicator.data.digits import prepare_digits

_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


@dataclasses.dataclass(frozen=True)
class ImageClassificationData:
    """Train and test splits of an image-classification dataset.

    Attributes:
        train: Unbatched `tf.data.Dataset` of `(image, label)`; float32 images in
            [0, 1] of `image_shape`, int32 labels.
        test: The same for the held-out split.
        num_classes: Number of labels.
        image_shape: `(height, width, channels)` after resizing.
        train_size: Number of training examples.
        test_size: Number of test examples.
        description: Where the data came from, for logs.
        pipeline_source: What `kr.data.image_pipeline` reads the same data from
            (the prepared TFDS directory), or `None` (an image folder: its
            train/test split exists only here).
        stored_image_shape: The images' shape as stored before resizing
            (`None` for a side that varies), or `None` if unknown.
    """

    train: tf.data.Dataset
    test: tf.data.Dataset
    num_classes: int
    image_shape: tuple
    train_size: int
    test_size: int
    description: str
    pipeline_source: str | None = None
    stored_image_shape: tuple | None = None


def load_image_classification(
    source: str = "digits",
    *,
    data_dir: str | None = None,
    image_size: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> ImageClassificationData:
    """Loads an image-classification dataset without any download.

    Args:
        source: `"digits"` (scikit-learn's digits, written once as a local TFDS
            dataset in 4 shards), the name of a TFDS dataset already prepared in
            `data_dir`, the directory of a prepared TFDS dataset (the folder with
            `dataset_info.json`), or a folder of images with one subfolder per class.
        data_dir: TFDS data directory for `"digits"` and TFDS names. Defaults to
            TFDS' default.
        image_size: Resize images to this height and width. Defaults to `None`
            (keep the stored size; an image folder then needs same-sized images).
        test_fraction: For an image folder, the fraction held out as the test
            split. Defaults to `0.2`.
        seed: Seed of the image folder's train/test split. Defaults to `0`.

    Returns:
        An `ImageClassificationData`.

    Example:
    >>> import tempfile
    >>> from keras_replicator.data import load_image_classification
    >>> data = load_image_classification(
    ...     "digits", data_dir=tempfile.mkdtemp(), image_size=16
    ... )
    Downloading and preparing dataset ...
    >>> data.image_shape, data.num_classes
    ((16, 16, 1), 10)
    """
    if not isinstance(source, str) or not source:
        raise ValueError(
            "`source` must be 'digits', a TFDS dataset name, a prepared TFDS "
            f"directory or an image folder. Received: source={source!r}."
        )
    check_int("image_size", image_size, allow_none=True)
    if not 0 < test_fraction < 1:
        raise ValueError(
            "`test_fraction` must be strictly between 0 and 1. "
            f"Received: test_fraction={test_fraction!r}."
        )
    path = os.path.expanduser(source)
    if source == "digits":
        builder = prepare_digits(data_dir)
        return _from_tfds(builder, image_size, "scikit-learn digits (local TFDS)")
    if os.path.isfile(os.path.join(path, "dataset_info.json")):
        builder = tfds.builder_from_directory(path)
        return _from_tfds(builder, image_size, f"TFDS directory {path}")
    if os.path.isdir(path):
        return _from_image_folder(path, image_size, test_fraction, seed)
    try:
        builder = tfds.builder(source, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise ValueError(
            f"`source` is neither a folder nor a known TFDS dataset. Received: "
            f"source={source!r}. Pass 'digits', an image folder with one subfolder "
            "per class, or the name or directory of a prepared TFDS dataset."
        ) from None
    if not builder.is_prepared():
        raise ValueError(
            f"TFDS dataset {source!r} is not prepared in {builder.data_dir!r}, and "
            f"this library does not download. Received: source={source!r}, "
            f"data_dir={data_dir!r}. Prepare it first (`tfds build {source}` on a "
            "machine with access) or pass `data_dir` where it lives."
        )
    return _from_tfds(builder, image_size, f"TFDS {builder.info.full_name}")


def _from_tfds(builder, image_size, description) -> ImageClassificationData:
    info = builder.info
    image_key, label_key = info.supervised_keys or ("image", "label")
    splits = info.splits
    test_split = next((s for s in ("test", "validation") if s in splits), None)
    if "train" not in splits or test_split is None:
        raise ValueError(
            f"{description} needs a 'train' and a 'test' (or 'validation') split. "
            f"Received: splits={sorted(splits)}."
        )
    shape = tuple(info.features[image_key].shape)
    if image_size is None and None in shape[:2]:
        raise ValueError(
            f"{description} stores images of varying size {shape}. Received: "
            "image_size=None. Pass `image_size` to resize them."
        )

    def read(split):
        dataset = builder.as_dataset(split=split, as_supervised=True)

        def prepare(image, label):
            return _prepare(image, image_size), tf.cast(label, tf.int32)

        return dataset.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)

    height, width = (image_size, image_size) if image_size else shape[:2]
    return ImageClassificationData(
        train=read("train"),
        test=read(test_split),
        num_classes=info.features[label_key].num_classes,
        image_shape=(height, width, shape[2]),
        train_size=splits["train"].num_examples,
        test_size=splits[test_split].num_examples,
        description=description,
        pipeline_source=os.fspath(builder.data_dir),
        stored_image_shape=shape,
    )


def _from_image_folder(path, image_size, test_fraction, seed):
    import keras

    classes = sorted(entry.name for entry in os.scandir(path) if entry.is_dir())
    if len(classes) < 2:
        raise ValueError(
            "An image folder needs one subfolder per class (at least 2). Received: "
            f"source={path!r} with subfolders {classes}."
        )
    size = (image_size, image_size) if image_size else None
    if size is None:
        size = _first_image_size(path, classes)
    train, test = keras.utils.image_dataset_from_directory(
        path,
        labels="inferred",
        label_mode="int",
        class_names=classes,
        batch_size=None,
        image_size=size,
        shuffle=True,
        seed=seed,
        validation_split=test_fraction,
        subset="both",
    )
    channels = train.element_spec[0].shape[-1]

    def scale(image, label):
        return image / 255.0, tf.cast(label, tf.int32)

    return ImageClassificationData(
        train=train.map(scale),
        test=test.map(scale),
        num_classes=len(classes),
        image_shape=(size[0], size[1], channels),
        train_size=int(train.cardinality()),
        test_size=int(test.cardinality()),
        description=f"image folder {path}",
    )


def _first_image_size(path, classes):
    for name in classes:
        for entry in sorted(os.scandir(os.path.join(path, name)), key=lambda e: e.name):
            if entry.name.lower().endswith(_IMAGE_SUFFIXES):
                image = tf.io.decode_image(tf.io.read_file(entry.path))
                return tuple(int(d) for d in image.shape[:2])
    raise ValueError(
        f"No images ({', '.join(_IMAGE_SUFFIXES)}) found under {path!r}. "
        f"Received: source={path!r}."
    )


def _prepare(image, image_size):
    image = tf.cast(image, tf.float32) / 255.0
    if image_size:
        image = tf.image.resize(image, (image_size, image_size))
    return image
