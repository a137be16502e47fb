"""The SN-GAN example runs end to end on 2 replicas (few steps, small batch)."""

import importlib.util
import pathlib

import numpy as np
import pytest

pytestmark = pytest.mark.slow(
    reason="covered in the default run by: clients kerasio_gan_without_call"
)

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "sngan_digits.py"


def _load():
    spec = importlib.util.spec_from_file_location("sngan_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trains_and_samples(tmp_path):
    example = _load()
    generator, history = example.train(
        replicas=2, steps=20, global_batch=32, verbose=False
    )
    assert len(history) == 1 and all(np.isfinite(history[0]))
    grid = example.sample_grid(generator, per_class=2)
    assert grid.shape == (80, 16)
    path = tmp_path / "grid.png"
    example.save_grid(grid, path)
    assert path.stat().st_size > 0
