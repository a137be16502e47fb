"""`image_pipeline` on real JPEG/PNG TFRecords written offline (fast)."""

import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.data import (
    _crop,
    digit_images,
    image_pipeline,
    write_image_tfrecords,
)
from keras_replicator.data.tfrecord_writer import encode_example

N = 48  # images; label i is image i's id, so every example can be traced


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("jpeg")
    images, _ = digit_images(N, 40)
    write_image_tfrecords(images, np.arange(N), str(directory), 4)
    return str(directory / "*.tfrecord")


def _labels(dataset):
    return np.concatenate([labels.numpy() for _, labels in dataset])


def test_training_batches_have_fixed_shapes_and_dtype(shards):
    dataset = image_pipeline(
        shards, batch_size=8, image_size=24, training=True, dtype="bfloat16", seed=0
    )
    images, labels = dataset.element_spec
    assert images.shape == (8, 24, 24, 3) and images.dtype == tf.bfloat16
    assert labels.shape == (8,) and labels.dtype == tf.int32
    batch, _ = next(iter(dataset))
    values = tf.cast(batch, tf.float32).numpy()
    assert 0.0 <= values.min() and values.max() <= 1.0


def test_evaluation_is_one_pass_in_fixed_order_with_a_short_last_batch(shards):
    dataset = image_pipeline(
        shards, batch_size=10, image_size=24, training=False, deterministic=True
    )
    sizes = [int(images.shape[0]) for images, _ in dataset]
    assert sizes == [10, 10, 10, 10, 8]
    labels = _labels(dataset)  # files interleaved, in a fixed order
    np.testing.assert_array_equal(np.sort(labels), np.arange(N))
    np.testing.assert_array_equal(_labels(dataset), labels)


def test_two_input_pipelines_read_disjoint_files_covering_the_dataset(shards):
    seen = []
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(2, pipeline_id, 2)
        dataset = image_pipeline(
            shards, batch_size=5, image_size=16, training=False, input_context=context
        )
        seen.append(set(_labels(dataset).tolist()))
        # Training (shuffled, repeated) draws from the same shard only.
        training = image_pipeline(
            shards, batch_size=12, image_size=16, training=True, input_context=context
        )
        drawn = np.concatenate([y.numpy() for _, y in training.take(6)])
        assert set(drawn.tolist()) == seen[-1]
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(N))


def test_fixed_seed_and_deterministic_order_repeat_exactly(shards):
    def batches(seed):
        dataset = image_pipeline(
            shards,
            batch_size=8,
            image_size=24,
            training=True,
            seed=seed,
            deterministic=True,
        )
        return [(x.numpy(), y.numpy()) for x, y in dataset.take(8)]

    first, again, other = batches(7), batches(7), batches(8)
    for (x1, y1), (x2, y2) in zip(first, again):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(first, other))


@pytest.mark.parametrize(
    "window", [(0, 0, 40, 40), (3, 5, 17, 29), (8, 0, 32, 11), (39, 39, 1, 1)]
)
@pytest.mark.parametrize("chroma_downsampling", [True, False])
def test_fused_decode_and_crop_gives_exactly_the_decoded_pixels(
    window, chroma_downsampling
):
    images, _ = digit_images(1, 40)
    jpeg = tf.io.encode_jpeg(
        images[0], quality=85, chroma_downsampling=chroma_downsampling
    )
    window = tf.constant(window)
    fused = _crop.decode_window(jpeg, window, fused=True, channels=3)
    unfused = _crop.decode_window(jpeg, window, fused=False, channels=3)
    y, x, h, w = window.numpy()
    whole = tf.io.decode_jpeg(jpeg, channels=3, fancy_upscaling=False).numpy()
    assert fused.dtype == tf.uint8 and fused.shape == (h, w, 3)
    np.testing.assert_array_equal(fused.numpy(), whole[y : y + h, x : x + w])
    np.testing.assert_array_equal(unfused.numpy(), whole[y : y + h, x : x + w])
    png = tf.io.encode_png(images[0])  # the fallback: decode then crop
    np.testing.assert_array_equal(
        _crop.decode_window(png, window, fused=True, channels=3).numpy(),
        images[0][y : y + h, x : x + w],
    )


def test_random_windows_stay_inside_the_image_and_follow_the_seed():
    shape = tf.constant([30, 50])
    windows = [
        _crop.random_window(shape, tf.constant([1, i])).numpy() for i in range(50)
    ]
    for y, x, h, w in windows:
        assert 0 <= y and y + h <= 30 and 0 <= x and x + w <= 50 and h * w > 0
    again = _crop.random_window(shape, tf.constant([1, 3])).numpy()
    np.testing.assert_array_equal(again, windows[3])
    np.testing.assert_array_equal(
        _crop.center_window(tf.constant([30, 50]), central_fraction=0.5),
        [8, 18, 15, 15],
    )


def test_whole_image_crops_equal_the_evaluation_images(shards):
    # crop_area_range=(1, 1) and no flips: training augments nothing, so each
    # image equals its one-pass evaluation image with a full-size center crop.
    common = {"batch_size": N, "image_size": 24, "seed": 3, "deterministic": True}
    train_images, train_labels = next(
        iter(
            image_pipeline(
                shards, training=True, crop_area_range=(1.0, 1.0), flip=False, **common
            )
        )
    )
    eval_images, eval_labels = next(
        iter(image_pipeline(shards, training=False, central_fraction=1.0, **common))
    )
    assert not np.array_equal(train_labels.numpy(), eval_labels.numpy())  # shuffled
    np.testing.assert_array_equal(
        train_images.numpy()[np.argsort(train_labels.numpy())],
        eval_images.numpy()[np.argsort(eval_labels.numpy())],
    )


def test_png_records_and_an_image_folder(tmp_path):
    images, _ = digit_images(12, 20)
    write_image_tfrecords(images, np.arange(12), str(tmp_path / "png"), 2, "png")
    dataset = image_pipeline(
        str(tmp_path / "png" / "*"),
        batch_size=4,
        image_size=20,
        training=False,
        central_fraction=1.0,
    )
    decoded = np.concatenate([x.numpy() for x, _ in dataset])
    order = np.argsort(_labels(dataset))
    np.testing.assert_allclose(decoded[order] * 255, images, atol=1e-3)  # lossless
    for label, name in enumerate(("cat", "dog")):
        (tmp_path / "folder" / name).mkdir(parents=True)
        for i in range(3):
            encode = tf.io.encode_jpeg if i % 2 else tf.io.encode_png
            path = str(
                tmp_path / "folder" / name / f"{i}.img.{'jpg' if i % 2 else 'png'}"
            )
            tf.io.write_file(path, encode(images[3 * label + i]))
    folder = image_pipeline(  # order is only fixed with deterministic=True
        str(tmp_path / "folder"),
        batch_size=6,
        image_size=16,
        training=False,
        deterministic=True,
    )
    np.testing.assert_array_equal(_labels(folder), [0, 0, 0, 1, 1, 1])


def test_tfds_source_reads_undecoded_images(tmp_path):
    from keras_replicator.data import prepare_digits

    prepare_digits(str(tmp_path))
    dataset = image_pipeline(
        "tfds:replicator_digits",
        data_dir=str(tmp_path),
        batch_size=32,
        image_size=16,
        training=False,
        channels=1,
    )
    count = sum(int(x.shape[0]) for x, _ in dataset)
    assert count == 359 and dataset.element_spec[0].shape[1:] == (16, 16, 1)


# ----------------------------------------------------------------- bad input
def test_missing_files_name_the_pattern(tmp_path):
    pattern = str(tmp_path / "nothing-*.tfrecord")
    with pytest.raises(ValueError, match="matches no files.*nothing-"):
        image_pipeline(pattern, batch_size=2, image_size=8, training=True)


def test_fewer_files_than_input_pipelines_names_the_counts(shards):
    context = tf.distribute.InputContext(5, 0, 5)
    with pytest.raises(ValueError, match="4 files for 5 input pipelines"):
        image_pipeline(
            shards, batch_size=2, image_size=8, training=True, input_context=context
        )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"dtype": "int8"}, "dtype"),
        ({"on_error": "ignore"}, "on_error"),
        ({"central_fraction": 0.0}, "central_fraction"),
        ({"num_parallel_calls": 0}, "num_parallel_calls"),
        ({"crop_area_range": (0.5, 0.2)}, r"crop_area_range=\(0.5, 0.2\)"),
        ({"crop_area_range": 1.0}, "crop_area_range=1.0"),
    ],
)
def test_bad_arguments(shards, kwargs, match):
    arguments = {"batch_size": 2, "image_size": 8, "training": True, **kwargs}
    with pytest.raises(ValueError, match=match):
        image_pipeline(shards, **arguments)


def test_writer_rejects_more_shards_than_images(tmp_path):
    with pytest.raises(ValueError, match="num_shards=3 for 2 images"):
        write_image_tfrecords(
            np.zeros([2, 8, 8, 3], np.uint8), [0, 1], str(tmp_path), 3
        )


def _write(path, encoded_images):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i, encoded in enumerate(encoded_images):
            writer.write(encode_example(encoded, i))
    return str(path)


@pytest.fixture(scope="module")
def jpegs():
    images, _ = digit_images(2, 32)
    good = tf.io.encode_jpeg(images[0]).numpy()
    return {
        "good": good,
        "not an image": b"not an image",
        "truncated": good[:300],
        "small": tf.io.encode_jpeg(images[1][:4, :4]).numpy(),
    }


@pytest.mark.parametrize(
    "kind, match",
    [
        ("not an image", "not a JPEG, PNG.*bad.tfrecord#1"),
        ("truncated", "JPEG"),
        ("small", "smaller than min_image_size.*bad.tfrecord#1"),
    ],
)
def test_bad_records_raise_naming_the_record(tmp_path, jpegs, kind, match):
    path = _write(tmp_path / "bad.tfrecord", [jpegs["good"], jpegs[kind]])
    dataset = image_pipeline(
        path, batch_size=1, image_size=16, training=False, min_image_size=8
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        list(dataset)


def test_skip_drops_bad_records_and_an_all_bad_pipeline_ends(tmp_path, jpegs):
    path = _write(tmp_path / "mixed.tfrecord", list(jpegs.values()))
    dataset = image_pipeline(
        path,
        batch_size=1,
        image_size=16,
        training=False,
        min_image_size=8,
        on_error="skip",
    )
    np.testing.assert_array_equal(_labels(dataset), [0])
    path = _write(tmp_path / "all-bad.tfrecord", [b"junk", jpegs["truncated"]])
    training = image_pipeline(
        path, batch_size=1, image_size=16, training=True, on_error="skip"
    )
    assert list(training) == []  # an empty repeat ends instead of spinning


def test_skipped_records_are_counted(tmp_path, jpegs):
    from keras_replicator.data import SkippedRecords

    path = _write(tmp_path / "mixed.tfrecord", list(jpegs.values()) * 2)
    skipped = SkippedRecords()
    dataset = image_pipeline(
        path,
        batch_size=2,
        image_size=16,
        training=False,
        min_image_size=8,
        on_error="skip",
        skipped=skipped,
    )
    assert len(_labels(dataset)) == 2
    assert (skipped.count, skipped.checked) == (6, 8)
    assert len(_labels(dataset)) == 2  # the second pass reads the cache
    assert (skipped.count, skipped.checked) == (6, 8)
    with pytest.raises(ValueError, match="on_error='raise'"):
        image_pipeline(path, batch_size=2, image_size=16, training=False,
                       skipped=SkippedRecords())  # fmt: skip
    with pytest.raises(TypeError, match="skipped=3"):
        image_pipeline(path, batch_size=2, image_size=16, training=False,
                       on_error="skip", skipped=3)  # fmt: skip


# ----------------------------------------------------------------- distributed
def test_fit_on_two_replicas_and_one_pass_over_distribute_input(shards):
    import keras

    import keras_replicator as kr

    strategy = kr.MultiDeviceReplicator(num_replicas=2)

    def train_fn(context):
        return image_pipeline(
            shards,
            batch_size=context.get_per_replica_batch_size(16),
            image_size=16,
            training=True,
            input_context=context,
            seed=0,
        )

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((16, 16, 3)),
                keras.layers.Conv2D(4, 3),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(N),
            ]
        )
        model.compile(
            keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    before = [w.numpy() for w in model.weights]
    for distributed in (
        strategy.distribute_datasets_from_function(train_fn),
        strategy.distribute_input(train_fn),
    ):
        history = model.fit(distributed, steps_per_epoch=3, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])
    assert any(not np.allclose(a, w.numpy()) for a, w in zip(before, model.weights))

    def eval_fn(context):  # per-replica batches of 6: 4 steps of 2 replicas
        return image_pipeline(
            shards,
            batch_size=context.get_per_replica_batch_size(12),
            image_size=16,
            training=False,
            input_context=context,
        )

    iterator = iter(strategy.distribute_input(eval_fn))

    def labels_of(batch):
        return batch[1]

    seen = [
        strategy.run_steps(labels_of, iterator, reduce="concat").numpy()
        for _ in range(4)
    ]
    assert all(len(labels) == 12 for labels in seen)
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(N))


def test_fit_on_a_plain_dataset_under_two_replicas(shards):
    import keras

    import keras_replicator as kr

    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((16, 16, 3)), keras.layers.Flatten(), keras.layers.Dense(N)]
        )
        model.compile(
            keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    dataset = image_pipeline(shards, batch_size=16, image_size=16, training=True)
    history = model.fit(dataset, steps_per_epoch=2, verbose=0)
    assert np.isfinite(history.history["loss"][0])


TWO_WORKERS = textwrap.dedent(
    """
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras, numpy as np
    import keras_replicator as kr
    from keras_replicator.data import image_pipeline

    pattern = sys.argv[1]
    strategy = kr.MultiWorkerReplicator(collective_timeout=120)
    contexts = []

    def train_fn(context):
        contexts.append(context)
        return image_pipeline(pattern, training=True, image_size=16, seed=0,
            batch_size=context.get_per_replica_batch_size(16),
            input_context=context)

    with strategy.scope():
        model = keras.Sequential([keras.Input((16, 16, 3)),
            keras.layers.Flatten(), keras.layers.Dense(48)])
        model.compile(keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(strategy.distribute_datasets_from_function(train_fn),
        steps_per_epoch=3, verbose=0)
    context = contexts[0]
    local = image_pipeline(pattern, training=False, image_size=16, batch_size=8,
        input_context=context)
    labels = sorted(int(v) for _, y in local for v in y.numpy())
    print("PIPELINES", context.num_input_pipelines, context.input_pipeline_id)
    print("LABELS", " ".join(map(str, labels)))
    print("LOSS", history.history["loss"][0])
    """
)


@pytest.mark.slow(
    reason="covered in the default run by: "
    "test_two_input_pipelines_read_disjoint_files_covering_the_dataset"
)
@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_two_workers_read_disjoint_shards_and_fit(shards):
    from keras_replicator.launch import run_workers

    result = run_workers(
        [sys.executable, "-c", TWO_WORKERS, shards], 2, timeout=240, echo=False
    )
    assert result.ok, result.describe_failure()
    seen = []
    for worker in result.workers:
        lines = dict(
            line.split(" ", 1)
            for line in worker.output.splitlines()
            if line.split(" ", 1)[0] in ("PIPELINES", "LABELS", "LOSS")
        )
        assert lines["PIPELINES"].split()[0] == "2"
        assert np.isfinite(float(lines["LOSS"]))
        seen.append(set(map(int, lines["LABELS"].split())))
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(N))
