"""`image_pipeline`: an image-classification input pipeline that keeps replicas fed.

Ying et al. (2018) sustained over a million ImageNet images a second on a TPU pod
with a handful of input optimizations; each has a tf.data equivalent, and this
builder assembles them in the order that makes each one pay:

1. **Per-worker file sharding** (`input_context`): each input pipeline lists the
   files and keeps every `num_input_pipelines`-th, so hosts never read the same
   bytes and need no coordination.
2. **Parallel interleaved reads** (`num_parallel_reads`): several TFRecord files are
   read at once, hiding file-system latency.
3. **Cache** (`cache`) of the *compressed* records: after the first epoch no file
   is read; caching before decoding keeps memory at the dataset's on-disk size and
   keeps the random crops fresh every epoch.
4. **Shuffle, then repeat** (training): one infinite stream, so no epoch boundary
   drains the buffers.
5. **Fused decode-and-random-crop** (`fused_crop`): `tf.io.decode_and_crop_jpeg`
   decodes only the crop window (see `_crop`), which covers part of the record's
   bounding box if it has one; center crop for evaluation; random flips; resize
   to `image_size`. Every image's size is read from its header first, and one
   over the pixel budget (`max_pixels`) is refused before decoding (see
   `_image_header`).
6. **Parallel map fused with batching** (`num_parallel_calls`): tf.data's default
   `map_and_batch_fusion` rewrite runs the map straight into the batch buffer;
   training batches drop the remainder so every step has the same static shape
   (XLA and TPUs need it; on GPUs/CPUs it avoids a retrace).
7. **bfloat16 output** (`dtype`): halves host-to-device bytes on accelerators
   that compute in bfloat16.
8. **Autotuned prefetch** (`prefetch`): the next batches are prepared while the
   replicas compute.

Randomness is stateless with a per-example seed derived from `seed`, the input
pipeline id and the example's position, so with `deterministic=True` a fixed seed
gives the same batches on every run at any parallelism. `deterministic=False` (the
default, as in Ying et al.) lets tf.data hand out whichever element is ready first.

**The tf.data service** (`data_service`): when this host's CPUs cannot keep up,
everything up to and including `batch` runs on tf.data service workers
(`keras_replicator.data.service`; `keras-replicator launch --data-service-workers
N` starts them) and only the prefetch runs here; the default `processing_mode`
needs `cache=False` (a cache would replay files). Files are then not sharded by
`input_context`: the training workers share one service job, which splits the
data (`processing_mode="distributed_epoch"`: every example once per epoch over all
of them) or not (`"parallel_epochs"`). All of them must build the same dataset,
so a `seed` is required and the job is named after a hash of the arguments. Order
is then never deterministic.
"""

from __future__ import annotations

import random

import tensorflow as tf

from keras_replicator.data import (
    _crop,
    _image_header,
    _pipeline_arguments,
    _schema,
    _sources,
    service,
)
from keras_replicator.data.skipped_records import SkippedRecords

# 100 megapixels: 300 MB a decode in RGB (see `max_pixels` and _image_header).
DEFAULT_MAX_PIXELS = 100_000_000


def image_pipeline(
    file_pattern,
    *,
    batch_size: int,
    image_size: int,
    training: bool,
    input_context: tf.distribute.InputContext | None = None,
    dtype: str = "float32",
    cache: bool | str = True,
    deterministic: bool = False,
    seed: int | None = None,
    shuffle_buffer: int = 1024,
    num_parallel_reads: int = tf.data.AUTOTUNE,
    num_parallel_calls: int = tf.data.AUTOTUNE,
    fused_crop: bool = True,
    prefetch: bool = True,
    flip: bool = True,
    channels: int = 3,
    central_fraction: float = 0.875,
    crop_area_range: tuple[float, float] = (0.08, 1.0),
    drop_remainder: bool | None = None,
    min_image_size: int = 1,
    on_error: str = "raise",
    split: str | None = None,
    data_dir: str | None = None,
    data_service: str | None = None,
    processing_mode: str = "distributed_epoch",
    job_name: str | None = None,
    skipped: SkippedRecords | None = None,
    label_offset: int | None = None,
    num_classes: int | None = None,
    use_bounding_boxes: bool = True,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> tf.data.Dataset:
    """Builds a batched `(images, labels)` pipeline from image files.

    Args:
        file_pattern: TFRecord files in the ImageNet schema (`image/encoded`: JPEG
            or PNG bytes, `image/class/label`: int64, optional
            `image/object/bbox/*` boxes) as a glob, a path or a list;
            or `"tfds:NAME"` (a TFDS dataset prepared in `data_dir`); or a prepared
            TFDS directory (holding `dataset_info.json`); or a folder with one
            subfolder of images per class.
        batch_size: Examples per batch this dataset yields. Under
            `distribute_datasets_from_function` that is the per-replica batch:
            `input_context.get_per_replica_batch_size(global_batch)`.
        image_size: Height and width of the output images.
        training: Random crops, flips, shuffle and repeat forever if `True`;
            center crop, one pass in order if `False`.
        input_context: The `tf.distribute.InputContext` of this input pipeline;
            files are sharded by it. Defaults to `None` (read every file).
        dtype: `"float32"`, `"bfloat16"` or `"float16"` images in [0, 1].
            Defaults to `"float32"`.
        cache: Cache the compressed records in memory (`True`), in files with
            this prefix (a string), or not (`False`). Defaults to `True`.
        deterministic: Keep element order fixed (see module docstring). Defaults
            to `False`.
        seed: Seed of file order, shuffle, crops and flips. Defaults to `None`
            (a fresh seed per call).
        shuffle_buffer: Examples in the shuffle buffer. Defaults to `1024`.
        num_parallel_reads: Files read at once; `1` reads them one after the
            other. Defaults to `tf.data.AUTOTUNE`.
        num_parallel_calls: Parallel decode calls; `1` decodes serially.
            Defaults to `tf.data.AUTOTUNE`.
        fused_crop: Decode only the crop window of JPEGs. Defaults to `True`.
        prefetch: End with `prefetch(AUTOTUNE)`. Defaults to `True`.
        flip: Random horizontal flips in training. Defaults to `True`.
        channels: 3 (RGB) or 1 (grayscale) output channels. Defaults to `3`.
        central_fraction: Side of the evaluation center crop as a fraction of the
            shorter side (224/256). Defaults to `0.875`.
        crop_area_range: `(low, high)` fraction of the image's area a training
            crop covers (aspect ratio 3/4..4/3). Defaults to `(0.08, 1.0)`
            (Inception-style random-resized crops for ImageNet-sized images; TF's
            ResNet reference uses `(0.05, 1.0)` with boxes); `(1.0, 1.0)` keeps
            whole images, for small or centered ones.
        drop_remainder: Drop a last partial batch. Defaults to `training`.
        min_image_size: Reject images with a side below this. Defaults to `1`.
        on_error: `"raise"`: a record that is not an image, cannot be decoded,
            is below `min_image_size` or over `max_pixels` raises
            `InvalidArgumentError` naming it (`file#index`, TFDS id or path).
            `"skip"`: such records are fully decoded (within the budget) once
            before the cache and dropped, tf.data logging one
            warning each ("Ignoring error ... <name>"), and counted in `skipped`
            if given. Defaults to `"raise"`.
        split: TFDS split. Defaults to `"train"` when training, else `"test"`
            (or `"validation"`).
        data_dir: TFDS data directory for `"tfds:NAME"`. Defaults to TFDS's.
        data_service: A tf.data service dispatcher address (`"grpc://host:port"`)
            to run the pipeline on, e.g. `kr.data.service_address()` (set by
            `keras-replicator launch --data-service-workers N`, else `None`).
            Defaults to `None`: everything runs in this process.
        processing_mode: With `data_service`: `"distributed_epoch"` (each
            example once per epoch over all service workers and consumers;
            TFRecord and folder sources) or `"parallel_epochs"` (every service
            worker runs the whole pipeline). Defaults to `"distributed_epoch"`.
        job_name: With `data_service`: consumers with the same name share a job.
            Defaults to `None`: a name derived from the arguments, the same in
            every training worker.
        skipped: A `kr.data.SkippedRecords` that counts the records
            `on_error="skip"` dropped (not with `data_service`). Defaults to
            `None`.
        label_offset: Subtracted from each TFRecord's stored label, so labels
            count from 0. Defaults to `None`: 1 for records that carry
            `image/class/synset` or `image/class/text` (TF's
            `build_imagenet_data.py`, `build_image_data.py`, `imagenet_to_gcs.py`
            store labels 1..N, 0 being a background class), else 0 (our
            `write_image_tfrecords`, and records with only image and label). Pass
            `0` to keep the stored labels (a 1001-way model with background),
            `1` for other 1-based records. TFDS and folder labels count from 0.
        num_classes: If given, every label must be in [0, `num_classes`) or
            reading raises `InvalidArgumentError` naming the record and
            `label_offset`; negative labels raise always. Defaults to `None`.
        use_bounding_boxes: Training crops cover at least a tenth of one of a
            record's `image/object/bbox/*` boxes (as TF's ResNet reference); a
            record without boxes, and every TFDS or folder image, uses the whole
            image. `False` ignores boxes. Defaults to `True`.
        max_pixels: The pixel budget: an image of more than this height x width
            is refused before decoding, with an error naming the record and its
            size (skipped and counted with `on_error="skip"`). Sizes come from
            the image headers, so a small compressed record cannot make a decode
            allocate gigabytes (3 bytes a pixel in RGB: 300 MB at the default).
            `None`: no budget. Defaults to `100_000_000` (above a 61 MP camera
            original; see docs/input_pipeline.md).

    Returns:
        A `tf.data.Dataset` of `(images, labels)`: images
        `[batch, image_size, image_size, channels]` of `dtype`, labels int32
        from 0 (see `label_offset`).

    Raises:
        ValueError: for bad arguments, a pattern that matches no file, or fewer
            files than input pipelines (without `data_service`).

    While reading, bad records raise `InvalidArgumentError` naming them (see
    `on_error`); so do labels out of range (see `num_classes`; without it, labels
    must fit int32) and a damaged TFRecord file, named with the byte where
    reading stopped.

    Example:
    >>> import numpy as np, os, tempfile
    >>> from keras_replicator.data import image_pipeline, write_image_tfrecords
    >>> directory = tempfile.mkdtemp()
    >>> images = np.zeros([8, 32, 32, 3], np.uint8)
    >>> _ = write_image_tfrecords(images, [0, 1] * 4, directory, num_shards=2)
    >>> pattern = os.path.join(directory, "data-*")
    >>> dataset = image_pipeline(pattern, batch_size=4, image_size=16, training=True)
    >>> images, labels = next(iter(dataset))
    >>> tuple(images.shape), tuple(labels.shape)
    ((4, 16, 16, 3), (4,))

    With a strategy, one pipeline per input worker reads its share of the files:

    >>> def input_fn(context):
    ...     return image_pipeline(pattern, training=True, image_size=16,
    ...         batch_size=context.get_per_replica_batch_size(8),
    ...         input_context=context)
    """
    _pipeline_arguments.check(
        batch_size=batch_size,
        image_size=image_size,
        shuffle_buffer=shuffle_buffer,
        min_image_size=min_image_size,
        max_pixels=max_pixels,
        label_offset=label_offset,
        num_classes=num_classes,
        num_parallel_reads=num_parallel_reads,
        num_parallel_calls=num_parallel_calls,
        dtype=dtype,
        on_error=on_error,
        channels=channels,
        central_fraction=central_fraction,
        crop_area_range=crop_area_range,
        training=training,
        use_bounding_boxes=use_bounding_boxes,
    )
    drop_remainder = training if drop_remainder is None else drop_remainder
    _pipeline_arguments.check_skipped(skipped, on_error, data_service)
    if data_service is not None:
        data_service = service.check_address(data_service)
        service.check_processing_mode(processing_mode)
        _pipeline_arguments.check_service(seed, cache, processing_mode)
        if job_name is None:
            job_name = service.job_name_for(
                file_pattern, batch_size, image_size, training, dtype, cache,
                seed, shuffle_buffer, fused_crop, flip, channels,
                central_fraction, tuple(crop_area_range), drop_remainder,
                min_image_size, on_error, split, data_dir, processing_mode,
                label_offset, num_classes, use_bounding_boxes, max_pixels,
            )  # fmt: skip
        input_context = None  # the service job splits the data, not the files
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    pipelines = input_context.num_input_pipelines if input_context else 1

    dataset = _sources.source(
        file_pattern,
        training=training,
        seed=seed,
        input_context=input_context,
        reads=num_parallel_reads,
        split=split,
        data_dir=data_dir,
        label_offset=label_offset,
        boxes=training and use_bounding_boxes,
    )
    if on_error == "skip":

        def validate(encoded, label, name, boxes):
            checked, _ = _image_header.check_image(
                encoded, name, min_size=min_image_size, max_pixels=max_pixels
            )
            decoded = _crop._decode_any(checked, channels)
            with tf.control_dependencies([decoded]):
                return tf.identity(checked), label, name, boxes

        if skipped is not None:
            dataset = skipped.count_checked(dataset)
        dataset = dataset.map(validate, num_parallel_calls=num_parallel_calls)
        dataset = dataset.ignore_errors(log_warning=True)
        if skipped is not None:
            dataset = skipped.count_kept(dataset)
    if cache:
        dataset = dataset.cache("" if cache is True else cache)
    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed).repeat()
    # Example k of pipeline p draws from seed (seed, k * pipelines + p): unique
    # across pipelines, fixed by position, independent of parallelism.
    if data_service is None:
        dataset = tf.data.Dataset.zip((dataset, tf.data.Dataset.counter()))
    else:
        # On the service a second source (`counter`) would be split too: one
        # dispatcher round-trip per example (4x slower in the benchmark). A running
        # count per service worker instead, its seed mixed with the record name
        # (service workers count from 0 alike).
        dataset = dataset.scan(
            tf.constant(0, tf.int64),
            lambda count, element: (count + 1, (element, count)),
        )

    def preprocess(element, index):
        encoded, label, name, boxes = element
        label = _schema.check_label(
            label, name, num_classes=num_classes, label_offset=label_offset
        )
        encoded, shape = _image_header.check_image(
            encoded, name, min_size=min_image_size, max_pixels=max_pixels
        )
        if training:
            stream = tf.constant(seed, tf.int64)
            if data_service is not None:
                stream += tf.strings.to_hash_bucket_fast(name, 2**40)
            example_seed = tf.stack([stream, index * pipelines + pipeline_id])
            window = _crop.random_window(
                shape, example_seed, area_range=crop_area_range, boxes=boxes
            )
        else:
            window = _crop.center_window(shape, central_fraction=central_fraction)
        image = _crop.decode_window(
            encoded, window, fused=fused_crop, channels=channels
        )
        image = tf.image.resize(image, [image_size, image_size]) / 255.0
        if training and flip:
            image = tf.image.stateless_random_flip_left_right(
                image, example_seed + tf.constant([1, 0], tf.int64)
            )
        return tf.cast(image, dtype), label

    dataset = dataset.map(preprocess, num_parallel_calls=num_parallel_calls)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    options = tf.data.Options()
    options.deterministic = deterministic
    if data_service is not None:
        dataset = service.distribute(
            dataset.with_options(options),
            data_service,
            processing_mode=processing_mode,
            job_name=job_name,
        )
    if prefetch:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    return dataset.with_options(options)
