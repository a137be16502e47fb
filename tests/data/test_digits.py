import os

import numpy as np
import pytest

from keras_replicator.data import ReplicatorDigits, prepare_digits


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return prepare_digits(str(tmp_path_factory.mktemp("tfds")), num_shards=3)


def test_writes_every_split_in_the_requested_number_of_shards(built):
    splits = built.info.splits
    assert splits["train"].num_examples == 1438
    assert splits["test"].num_examples == 359
    assert splits["train"].num_shards == 3 and splits["test"].num_shards == 3
    files = [f for f in os.listdir(built.data_dir) if ".tfrecord-" in f]
    assert len(files) == 6


def test_holds_scikit_learn_digits_scaled_to_uint8(built):
    from sklearn.datasets import load_digits

    digits = load_digits()
    expected = {
        tuple(np.round(image * 255 / 16).astype(np.uint8).ravel()): label
        for image, label in zip(digits.images, digits.target)
    }
    seen = 0
    for split in ("train", "test"):
        for image, label in built.as_dataset(split=split, as_supervised=True):
            assert image.shape == (8, 8, 1)
            assert expected[tuple(image.numpy().ravel())] == int(label)
            seen += 1
    assert seen == len(digits.target)


def test_second_call_reuses_the_prepared_files(built):
    before = sorted(os.listdir(built.data_dir))
    again = prepare_digits(os.path.dirname(os.path.dirname(built.data_dir)))
    assert again.data_dir == built.data_dir
    assert sorted(os.listdir(built.data_dir)) == before


def test_builder_is_registered_under_its_name():
    assert ReplicatorDigits.name == "replicator_digits"


def test_bad_shard_count_is_a_clear_error():
    with pytest.raises(ValueError, match="num_shards=0"):
        prepare_digits("/nonexistent", num_shards=0)
