"""`image_pipeline`'s pixel budget (`max_pixels`): sizes read from image headers.

A PNG, GIF or BMP record has no fused decoder: before, it was decoded whole to
learn its size, then decoded again to crop, so a small compressed record could
cost gigabytes (a 97 KB PNG of 10000x10000 raised a process's peak memory by
532 MB). Now every format's size comes from its header, and an image over
`max_pixels` is refused before anything decodes it.
"""

import io
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_replicator.data import SkippedRecords, _image_header, image_pipeline
from keras_replicator.data.tfrecord_writer import encode_example


def png_bomb(width, height):
    """A tiny PNG of `width` x `height` black pixels, compressed row by row."""

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    compressor = zlib.compressobj(9)
    row = b"\0" * (width + 1)  # filter byte + grayscale pixels
    data = b"".join(compressor.compress(row) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"".join(
        [
            b"\x89PNG\r\n\x1a\n",
            chunk(b"IHDR", header),
            chunk(b"IDAT", data + compressor.flush()),
            chunk(b"IEND", b""),
        ]
    )


def encode(image, kind):
    """`image` (uint8 HxWx3) as `kind` bytes."""
    if kind == "jpeg":
        return tf.io.encode_jpeg(image).numpy()
    if kind == "png":
        return tf.io.encode_png(image).numpy()
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format=kind.upper())
    return buffer.getvalue()


def _write(path, encoded_images):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i, encoded in enumerate(encoded_images):
            writer.write(encode_example(encoded, i))
    return str(path)


def _read(path, **kwargs):
    # Decodes are parallel: deterministic=True keeps the records in order.
    kwargs.setdefault("deterministic", True)
    dataset = image_pipeline(path, batch_size=1, image_size=8, training=False, **kwargs)
    return np.concatenate([labels.numpy() for _, labels in dataset])


KINDS = ["jpeg", "png", "gif", "bmp"]


@pytest.mark.parametrize("kind", KINDS)
def test_header_sizes_are_the_decoded_sizes(kind):
    rng = np.random.default_rng(0)
    for height, width in [(1, 1), (7, 300), (301, 5), (64, 48)]:
        image = rng.integers(0, 255, [height, width, 3], dtype=np.uint8)
        encoded = encode(image, kind)
        decoded = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        shape = _image_header.header_shape(tf.constant(encoded))
        assert shape.dtype == tf.int64
        assert shape.numpy().tolist() == list(decoded.shape[:2]) == [height, width]


def test_a_top_down_bmp_has_a_positive_height():
    encoded = bytearray(encode(np.zeros([5, 9, 3], np.uint8), "bmp"))
    encoded[22:26] = struct.pack("<i", -5)  # rows stored top-down
    shape = _image_header.header_shape(tf.constant(bytes(encoded)))
    assert shape.numpy().tolist() == [5, 9]
    decoded = tf.io.decode_image(bytes(encoded), channels=3)
    assert decoded.shape[:2] == (5, 9)


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(
            kind,
            marks=pytest.mark.slow(
                reason="covered in the default run by: the same test [png]"
            ),
        )
        if kind == "jpeg"
        else kind
        for kind in KINDS
    ],
)
def test_images_over_max_pixels_raise_naming_the_record_and_the_budget(tmp_path, kind):
    small = encode(np.full([30, 40, 3], 90, np.uint8), kind)
    large = encode(np.full([40, 41, 3], 90, np.uint8), kind)
    path = _write(tmp_path / f"{kind}.tfrecord", [small, large])
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=rf"max_pixels=1600.*\[40 41\].*{kind}.tfrecord#1",
    ):
        _read(path, max_pixels=1600)
    np.testing.assert_array_equal(_read(path, max_pixels=1640), [0, 1])
    np.testing.assert_array_equal(_read(path, max_pixels=None), [0, 1])


def test_a_png_bomb_is_refused_by_default_before_decoding(tmp_path):
    # 12000 x 12000 = 144 megapixels in 140 KB; its data is cut short, so a decoder
    # would fail with a PNG error: the budget's error shows nothing decoded it.
    bomb = png_bomb(12000, 12000)
    path = _write(tmp_path / "bomb.tfrecord", [bomb[: len(bomb) // 2]])
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"max_pixels=100000000.*\[12000 12000\].*bomb.tfrecord#0",
    ):
        _read(path)


def test_skip_drops_and_counts_images_over_the_budget(tmp_path):
    images = [encode(np.zeros([side, side, 3], np.uint8), "png") for side in (8, 40)]
    path = _write(tmp_path / "mixed.tfrecord", images * 2)
    skipped = SkippedRecords()
    labels = _read(path, max_pixels=100, on_error="skip", skipped=skipped)
    np.testing.assert_array_equal(labels, [0, 2])
    assert (skipped.count, skipped.checked) == (2, 4)


@pytest.mark.parametrize(
    "value, error",
    [(0, ValueError), (1.5e8, ValueError), ("64M", ValueError), (True, ValueError)],
)
def test_bad_max_pixels(tmp_path, value, error):
    path = _write(
        tmp_path / "one.tfrecord", [encode(np.zeros([8, 8, 3], np.uint8), "png")]
    )
    with pytest.raises(error, match=f"max_pixels={value!r}"):
        image_pipeline(path, batch_size=1, image_size=8, training=True,
                       max_pixels=value)  # fmt: skip


_PEAK = textwrap.dedent(
    """
    import resource, sys
    import tensorflow as tf
    from keras_replicator.data import image_pipeline
    path = sys.argv[1]
    dataset = image_pipeline(path, batch_size=1, image_size=8, training=False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        list(dataset)
        outcome = "read"
    except tf.errors.InvalidArgumentError as error:
        outcome = "refused" if "max_pixels" in str(error) else str(error)
    rise = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(outcome, rise // 1024)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_png_bomb_does_not_raise_peak_memory(tmp_path):
    # 10000 x 10000 black pixels in 97 KB: decoded to RGB, 300 MB. Before the
    # budget the pipeline read it and the peak rose by 532 MB; now it is refused.
    path = _write(tmp_path / "bomb.tfrecord", [png_bomb(10001, 10000)])
    run = subprocess.run(
        [sys.executable, "-c", _PEAK, path],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    outcome, rise_mb = run.stdout.split()[-2:]
    assert outcome == "refused"
    assert int(rise_mb) < 50, f"peak memory rose by {rise_mb} MB"


def gif(screen, frames):
    """A GIF with a `screen` (width, height) logical screen and black `frames`
    [(width, height), ...]: each frame LZW-coded as a clear code before every
    other pixel (2-colour table, 3-bit codes)."""
    out = (
        b"GIF89a" + struct.pack("<HHBBB", *screen, 0x80, 0, 0) + bytes(3) + b"\xff" * 3
    )
    for width, height in frames:
        codes = [
            code
            for i in range(width * height)
            for code in ([4, 0] if i % 2 == 0 else [0])
        ]
        bits = sum(code << (3 * i) for i, code in enumerate(codes + [5]))
        data = bits.to_bytes((3 * (len(codes) + 1) + 7) // 8, "little")
        out += b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02"
        for start in range(0, len(data), 255):
            out += bytes([len(data[start : start + 255])]) + data[start : start + 255]
        out += b"\x00"
    return out + b"\x3b"


@pytest.mark.parametrize(
    "screen, frames, shape",
    [
        ((1, 1), [(40, 30)], [30, 40]),  # a frame beyond the logical screen
        ((50, 50), [(10, 10)], [10, 10]),
        ((10, 10), [(40, 10), (10, 30)], [30, 40]),  # the largest of each side
    ],
)
def test_a_gif_is_sized_by_its_frames_not_its_logical_screen(screen, frames, shape):
    """Issue 49, item 10. Before: the logical screen's size was read, while TF
    decodes at the frames' (a 1x1 screen and a 12000x12000 frame cost 564 MB)."""
    encoded = gif(screen, frames)
    decoded = tf.io.decode_gif(encoded)
    assert list(decoded.shape[1:3]) == shape
    assert _image_header.header_shape(tf.constant(encoded)).numpy().tolist() == shape
    got, count = _image_header.gif_frames(tf.constant(encoded))
    assert got.numpy().tolist() == shape and int(count) == len(frames)


@pytest.mark.parametrize("frames", [[(64, 64)], [(20, 20)] * 5])
def test_a_gif_over_the_budget_in_its_frames_is_refused(tmp_path, frames):
    # 4096 and 5 x 400 = 2000 pixels decoded; the logical screen says 1.
    path = _write(tmp_path / "gif.tfrecord", [gif((1, 1), frames)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_pixels=1600"):
        _read(path, max_pixels=1600)
    np.testing.assert_array_equal(_read(path, max_pixels=4096), [0])
