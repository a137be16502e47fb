"""`write_image_tfrecords` and `digit_images` (fast)."""

import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.data import digit_images, write_image_tfrecords


def test_shards_hold_contiguous_blocks_in_the_imagenet_schema(tmp_path):
    images, labels = digit_images(10, 16)
    assert images.shape == (10, 16, 16, 3) and images.dtype == np.uint8
    paths = write_image_tfrecords(images, labels, str(tmp_path), 3, "png")
    features = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }
    seen, index = [], 0
    for path in paths:
        records = list(tf.data.TFRecordDataset(path))
        seen.append(len(records))
        for record in records:
            example = tf.io.parse_single_example(record, features)
            image = tf.io.decode_png(example["image/encoded"]).numpy()
            np.testing.assert_array_equal(image, images[index])  # PNG: lossless
            assert int(example["image/class/label"]) == labels[index]
            index += 1
    assert seen == [4, 3, 3]


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="same length"):
        write_image_tfrecords(np.zeros([2, 4, 4, 3], np.uint8), [0], str(tmp_path), 1)
    with pytest.raises(ValueError, match="uint8"):
        write_image_tfrecords(np.zeros([2, 4, 4, 3]), [0, 1], str(tmp_path), 1)
    with pytest.raises(ValueError, match="format"):
        write_image_tfrecords(
            np.zeros([2, 4, 4, 3], np.uint8), [0, 1], str(tmp_path), 1, "gif"
        )


def test_boxes_are_written_in_the_imagenet_schema(tmp_path):
    images, labels = digit_images(3, 16)
    boxes = [[[0.1, 0.2, 0.5, 0.6], [0.0, 0.0, 1.0, 1.0]], [], [[0.5, 0.5, 0.75, 1]]]
    (path,) = write_image_tfrecords(images, labels, str(tmp_path), 1, boxes=boxes)
    features = {
        f"image/object/bbox/{c}": tf.io.VarLenFeature(tf.float32)
        for c in ("ymin", "xmin", "ymax", "xmax")
    }
    features["image/object/bbox/label"] = tf.io.VarLenFeature(tf.int64)
    for record, expected, label in zip(tf.data.TFRecordDataset(path), boxes, labels):
        example = tf.io.parse_single_example(record, features)
        found = np.stack(
            [
                example[f"image/object/bbox/{c}"].values
                for c in "ymin xmin ymax xmax".split()
            ],
            axis=1,
        )
        np.testing.assert_allclose(found, np.reshape(expected, [-1, 4]))
        assert example["image/object/bbox/label"].values.numpy().tolist() == [
            label
        ] * len(expected)


@pytest.mark.parametrize(
    "boxes, match",
    [
        ([[[0, 0, 1, 1]]], "one list of boxes per image"),
        ([[[0, 0, 1, 1]], [[0.5, 0, 0.4, 1]]], r"boxes\[1\]"),
        ([[[0, 0, 1, 1]], [[0, 0, 1, 1.5]]], r"boxes\[1\]"),
        ([[[0, 0, 1, 1]], [0, 0, 1]], r"boxes\[1\]"),
    ],
)
def test_bad_boxes_are_named(tmp_path, boxes, match):
    with pytest.raises(ValueError, match=match):
        write_image_tfrecords(
            np.zeros([2, 4, 4, 3], np.uint8), [0, 1], str(tmp_path), 1, boxes=boxes
        )
