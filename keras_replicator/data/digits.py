"""scikit-learn's handwritten digits as a local TFDS dataset, written in several shards.

The digits (1,797 8x8 grey images, bundled with scikit-learn, no download) are the
library's offline stand-in for an image dataset. Writing them once as a real TFDS
dataset -- TFRecord shards, a `dataset_info.json`, splits -- means the demo and the
notebooks read them exactly as they would read ImageNet from TFDS: the same
`tfds.builder(...).as_dataset(...)` path, and under several workers each worker reads
its own files (`tfds.ReadConfig(input_context=...)` or tf.data's FILE auto-sharding).
TFDS offers no builder for in-memory arrays, hence this small one.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow_datasets as tfds

from keras_replicator._arguments import check_int

TEST_FRACTION = 0.2
_SPLIT_SEED = 0


class ReplicatorDigits(tfds.core.GeneratorBasedBuilder):
    """TFDS builder: scikit-learn's digits, fixed 80/20 train/test split.

    Images are `uint8` of shape (8, 8, 1) scaled from scikit-learn's 0..16 to 0..255;
    labels are 0..9. The split is a fixed permutation (seed 0), so every machine
    builds the same dataset.
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "scikit-learn digits, 80/20 split with seed 0."}

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description="scikit-learn's 8x8 handwritten digits (UCI optdigits).",
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(8, 8, 1)),
                    "label": tfds.features.ClassLabel(num_classes=10),
                }
            ),
            supervised_keys=("image", "label"),
            homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # bundled with scikit-learn: nothing to download
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
        labels = digits.target.astype(np.int64)
        order = np.random.default_rng(_SPLIT_SEED).permutation(len(labels))
        test_count = int(round(TEST_FRACTION * len(labels)))
        return {
            "train": self._generate_examples(images, labels, order[test_count:]),
            "test": self._generate_examples(images, labels, order[:test_count]),
        }

    def _generate_examples(self, images, labels, indices):
        for index in indices:
            yield int(index), {"image": images[index], "label": int(labels[index])}


def prepare_digits(data_dir: str | None = None, num_shards: int = 4):
    """Builds the digits dataset once (if needed) and returns its TFDS builder.

    Args:
        data_dir: Where TFDS datasets live. Defaults to TFDS' default
            (`$TFDS_DATA_DIR` or `~/tensorflow_datasets`).
        num_shards: TFRecord files per split, so per-worker file sharding has
            files to split. Defaults to `4`.

    Returns:
        The prepared `tfds.core.DatasetBuilder`; read it with `as_dataset(split=...)`.

    Example:
    >>> import tempfile
    >>> from keras_replicator.data import prepare_digits
    >>> builder = prepare_digits(tempfile.mkdtemp())
    Downloading and preparing dataset ...
    Dataset replicator_digits downloaded and prepared to ... reuse this data.
    >>> builder.info.splits["train"].num_examples
    1438
    """
    check_int("num_shards", num_shards)
    if data_dir is not None:
        data_dir = os.path.expanduser(data_dir)
    builder = ReplicatorDigits(data_dir=data_dir)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(num_shards=num_shards)
    )
    return builder
