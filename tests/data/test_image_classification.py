import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.data import load_image_classification, prepare_digits


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tfds"))
    prepare_digits(path)
    return path


def test_digits_resized_to_float_images(data_dir):
    data = load_image_classification("digits", data_dir=data_dir, image_size=16)
    assert data.image_shape == (16, 16, 1) and data.num_classes == 10
    assert (data.train_size, data.test_size) == (1438, 359)
    image, label = next(iter(data.train))
    assert image.shape == (16, 16, 1) and image.dtype == tf.float32
    assert 0.0 <= float(tf.reduce_min(image)) and float(tf.reduce_max(image)) <= 1.0
    assert label.dtype == tf.int32
    assert sum(1 for _ in data.test) == 359


def test_prepared_tfds_directory_and_name(data_dir):
    by_directory = load_image_classification(f"{data_dir}/replicator_digits/1.0.0")
    assert by_directory.image_shape == (8, 8, 1)
    by_name = load_image_classification("replicator_digits", data_dir=data_dir)
    assert by_name.train_size == by_directory.train_size == 1438


def test_image_folder_with_a_subfolder_per_class(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("cat", "dog", "eel"):
        (tmp_path / name).mkdir()
        for i in range(10):
            pixels = rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)
            path = str(tmp_path / name / f"{i}.png")
            tf.io.write_file(path, tf.io.encode_png(pixels))
    data = load_image_classification(str(tmp_path), test_fraction=0.2)
    assert data.num_classes == 3 and data.image_shape == (12, 12, 3)
    assert (data.train_size, data.test_size) == (24, 6)
    image, label = next(iter(data.train))
    assert image.shape == (12, 12, 3) and float(tf.reduce_max(image)) <= 1.0
    assert 0 <= int(label) < 3


def test_unknown_source_names_what_to_pass():
    with pytest.raises(ValueError, match="source='no_such_dataset_xyz'"):
        load_image_classification("no_such_dataset_xyz")


def test_unprepared_tfds_dataset_is_not_downloaded(tmp_path):
    with pytest.raises(ValueError, match="not prepared"):
        load_image_classification("mnist", data_dir=str(tmp_path))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"source": ""}, "source"),
        ({"image_size": 0}, "image_size=0"),
        ({"test_fraction": 1.0}, "test_fraction"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_image_classification(**kwargs)


def test_image_folder_needs_class_subfolders(tmp_path):
    (tmp_path / "only").mkdir()
    with pytest.raises(ValueError, match="one subfolder per class"):
        load_image_classification(str(tmp_path))
