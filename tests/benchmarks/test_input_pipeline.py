"""The pure helpers of benchmarks/input_pipeline.py (fast, no TensorFlow work)."""

import pytest

from benchmarks import input_pipeline as bench


def test_summarize_takes_the_median_over_rounds():
    runs = {bench.FULL: [10.0, 30.0, 20.0], "no cache": [5.0, 7.0], "empty": []}
    assert bench.summarize(runs) == {bench.FULL: 20.0, "no cache": 6.0}


def test_ratios_are_against_the_full_pipeline_of_the_same_run():
    summary = {bench.FULL: 40.0, "no cache": 10.0, "bfloat16 output": 50.0}
    assert bench.ratios(summary) == {
        bench.FULL: 1.0,
        "no cache": 0.25,
        "bfloat16 output": 1.25,
    }
    with pytest.raises(ValueError, match="baseline"):
        bench.ratios({"no cache": 1.0})


def test_table_rows_hold_rate_images_and_ratio():
    text = bench.table({bench.FULL: 40.0, "no cache": 10.0}, batch_size=64)
    lines = text.splitlines()
    assert lines[0] == "| arm | batches/s | images/s | / full pipeline |"
    assert lines[2] == "| full pipeline | 40.0 | 2,560 | 1.00x |"
    assert lines[3] == "| no cache | 10.0 | 640 | 0.25x |"


def test_rotate_starts_each_arm_once():
    arms = ["a", "b", "c"]
    assert [bench.rotate(arms, r)[0] for r in range(3)] == ["a", "b", "c"]
    assert bench.rotate(arms, 4) == ["b", "c", "a"]


def test_every_ablation_arm_is_a_valid_image_pipeline_option():
    import inspect

    from keras_replicator.data import image_pipeline

    names = set(inspect.signature(image_pipeline).parameters)
    for arm, options in bench.ABLATION.items():
        assert set(options) <= names, arm
