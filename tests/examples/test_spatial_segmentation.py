"""The spatial segmentation example trains partitioned like one device (tiny run)."""

import importlib.util
import pathlib

import numpy as np
import pytest

pytestmark = pytest.mark.slow(
    reason="covered in the default run by: spatial/test_unet.py"
)

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "spatial_segmentation.py"


def _load():
    spec = importlib.util.spec_from_file_location("spatial_segmentation", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_images_and_masks_agree():
    example = _load()
    images, masks = example.make_images(4, 32, seed=3)
    assert images.shape == (4, 32, 32, 1) and masks.shape == (4, 32, 32)
    assert set(np.unique(masks)) == {0, 1, 2}
    means = [images[masks == c].mean() for c in range(3)]
    np.testing.assert_allclose(means, [0.0, 1.0, -1.0], atol=0.2)


def test_trains_partitioned_like_one_device():
    example = _load()
    result = example.train(
        epochs=1,
        image_size=32,
        parts=2,
        replicas=2,
        train_images=16,
        test_images=8,
        batch_size=8,
        dtype="float64",
        verbose=False,
    )
    assert result["max_weight_difference"] < 1e-10, result
    assert result["accuracy_partitioned"] == result["accuracy_plain"], result
    assert result["accuracy_partitioned"] > result["accuracy_before"], result
