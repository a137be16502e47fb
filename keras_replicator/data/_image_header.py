"""An image's format and size from its first bytes, checked before any decode.

A decoder allocates the whole image before it reads a pixel, and compressed
formats make that cheap to abuse: a PNG of 10000x10000 black pixels is 97 KB and
decodes to 300 MB (3 channels); it used to be decoded twice, once to learn its
size and once to crop it, and raised a process's peak memory by 532 MB. So every
record's size is read from its header -- the JPEG frame header
(`tf.io.extract_jpeg_shape`), PNG's IHDR chunk (big-endian width and height at
bytes 16 and 20), every GIF frame's image descriptor (below), BMP's info
header (little-endian 32-bit width and height at 18 and 22; a negative height
means rows stored top-down) -- and an image over the
pixel budget (`max_pixels`) is refused with an error naming the record before
anything decodes it. Those are the sizes TF's decoders return, and the crop
window is computed from them, so a PNG, GIF or BMP is now decoded once.

A GIF is decoded at none of the sizes its first bytes hold: TF decodes every
frame (even for the first one alone) into one tensor of the largest frame
height by the largest frame width, whatever the logical screen says (a 54 KB
GIF with a 1x1 screen and a 12000x12000 frame used to pass and cost 564 MB).
So a GIF's blocks are walked in the graph, skipping the data sub-blocks (one
loop step per 255 bytes of data, GIFs only), to the image descriptor of every
frame (`0x2C`, little-endian 16-bit width and height at its bytes 5 and 7); its
size is `[largest height, largest width]`, and the budget bounds frames x
height x width, what the decode holds. Progressive JPEGs also keep their
coefficients (about 2 bytes a pixel and channel) while decoding: the budget
bounds them too.
"""

from __future__ import annotations

import tensorflow as tf

_PNG = b"\x89PNG\r\n\x1a\n"
_HEAD = 32  # bytes read; every size field lies within them


def header_shape(encoded):
    """`[height, width]` (int64) from an encoded image's header; `[0, 0]` if unknown.

    Args:
        encoded: Scalar string tensor, a JPEG, PNG, GIF or BMP file's bytes.

    Returns:
        An int64 `[2]` tensor.

    Example:
    >>> import tensorflow as tf
    >>> header_shape(tf.io.encode_png(tf.zeros([3, 5, 1], tf.uint8))).numpy()
    array([3, 5])
    """
    return _shape_and_frames(encoded)[0]


def _shape_and_frames(encoded):
    """`header_shape` and the frames a decode holds (a GIF's, else 1)."""
    head = _head(encoded)
    raw = tf.cast(tf.io.decode_raw(head, tf.uint8), tf.int64)

    def little(start, size):
        return sum(raw[start + i] * 256**i for i in range(size))

    def big(start, size):
        return sum(raw[start + i] * 256 ** (size - 1 - i) for i in range(size))

    def signed32(value):
        return tf.where(value >= 2**31, value - 2**32, value)

    png = tf.stack([big(20, 4), big(16, 4)])
    bmp = tf.stack([tf.abs(signed32(little(22, 4))), signed32(little(18, 4))])
    other = tf.where(_is_png(head), png, tf.zeros([2], tf.int64))
    other = tf.where(_is_bmp(head), bmp, other)
    one = tf.constant(1, tf.int64)
    return tf.cond(
        tf.io.is_jpeg(encoded),
        lambda: (tf.cast(tf.io.extract_jpeg_shape(encoded)[:2], tf.int64), one),
        lambda: tf.cond(
            _is_gif(head), lambda: gif_frames(encoded), lambda: (other, one)
        ),
    )


def gif_frames(encoded):
    """`([largest frame height, largest width], frames)` of a GIF (int64).

    TF decodes a GIF at this size, every frame of it (module docstring).

    Example:
    >>> import io, numpy as np, tensorflow as tf
    >>> from PIL import Image
    >>> out = io.BytesIO()
    >>> Image.fromarray(np.zeros([3, 5], np.uint8)).save(out, format="GIF")
    >>> shape, frames = gif_frames(tf.constant(out.getvalue()))
    >>> shape.numpy().tolist(), int(frames)
    ([3, 5], 1)
    """
    data = tf.io.decode_raw(encoded, tf.uint8)
    size = tf.size(data, out_type=tf.int64)
    data = tf.cast(tf.concat([data, tf.zeros([16], tf.uint8)], 0), tf.int64)

    def at(i):
        return tf.gather(data, tf.minimum(tf.cast(i, tf.int64), size + 15))

    def little16(i):
        return at(i) + 256 * at(i + 1)

    def color_table(flags):  # its bytes, when the flags' top bit says there is one
        bits = tf.bitwise.bitwise_and(flags, 7) + 1
        return tf.where(
            flags >= 128, 3 * tf.bitwise.left_shift(tf.ones_like(bits), bits), 0
        )

    def step(pos, in_blocks, height, width, frames, done):
        byte = at(pos)
        # In data sub-blocks: each starts with its length, 0 ends them.
        after_block = tf.where(byte == 0, pos + 1, pos + byte + 1)
        # Else a block starts: an image descriptor (then the local colour table,
        # the LZW code size and data sub-blocks), an extension (label, then
        # sub-blocks), or the trailer (0x3B) or garbage: the end.
        image, extension = byte == 0x2C, byte == 0x21
        after_image = pos + 10 + color_table(at(pos + 9)) + 1
        new_pos = tf.where(
            in_blocks, after_block, tf.where(image, after_image, pos + 2)
        )
        frame = tf.logical_and(tf.logical_not(in_blocks), image)
        height = tf.where(frame, tf.maximum(height, little16(pos + 7)), height)
        width = tf.where(frame, tf.maximum(width, little16(pos + 5)), width)
        frames += tf.cast(frame, tf.int64)
        end = tf.logical_not(in_blocks | image | extension) | (new_pos >= size)
        blocks = tf.where(in_blocks, byte != 0, image | extension)
        return new_pos, blocks, height, width, frames, end

    zero = tf.constant(0, tf.int64)
    start = 13 + color_table(at(10))  # after the screen and the global table
    state = (start, tf.constant(False), zero, zero, zero, start >= size)
    _, _, height, width, frames, _ = tf.while_loop(
        lambda *state: tf.logical_not(state[-1]), step, state
    )
    return tf.stack([height, width]), frames


def check_image(encoded, name, *, min_size: int, max_pixels: int | None):
    """Asserts that `encoded` is an image of sides >= `min_size`, <= `max_pixels`.

    Nothing is decoded: the size comes from the header (see the module docstring).

    Args:
        encoded: Scalar string tensor, the record's image bytes.
        name: Scalar string tensor naming the record in the errors.
        min_size: Smallest side accepted.
        max_pixels: Largest height x width accepted; `None` accepts any.

    Returns:
        `(encoded, [height, width])` (int32), both gated on the checks, so
        nothing downstream decodes a bad record before an assertion names it.
    """
    head = _head(encoded)
    header_ok = tf.io.is_jpeg(encoded) | _is_png(head) | _is_gif(head) | _is_bmp(head)
    assert_header = tf.debugging.Assert(
        header_ok,
        ["Record is not a JPEG, PNG, GIF or BMP image:", name],
        name="check_image_header",
    )
    with tf.control_dependencies([assert_header]):
        # Every frame of a GIF is decoded (module docstring); others have one.
        shape, frames = _shape_and_frames(encoded)
    checks = []
    if max_pixels is not None:
        checks.append(
            tf.debugging.Assert(
                shape[0] * shape[1] * frames <= max_pixels,
                [
                    f"Image over the pixel budget max_pixels={max_pixels} (height x "
                    "width, x frames for a GIF), refused before decoding (a decode "
                    "takes 3 bytes a pixel in RGB). Pass a larger `max_pixels` to "
                    "image_pipeline, or max_pixels=None for no budget. [height "
                    "width], frames, record:",
                    shape,
                    frames,
                    name,
                ],
                name="check_image_pixels",
            )
        )
    with tf.control_dependencies(checks):
        checks.append(
            tf.debugging.Assert(
                tf.reduce_all(shape >= min_size),
                ["Image smaller than min_image_size", min_size, "shape:", shape, name],
                name="check_image_size",
            )
        )
    with tf.control_dependencies(checks):
        return tf.identity(encoded), tf.cast(shape, tf.int32)


def _head(encoded):
    """The first `_HEAD` bytes of `encoded`, zero-padded if it is shorter."""
    return tf.strings.substr(tf.strings.join([encoded, b"\0" * _HEAD]), 0, _HEAD)


def _is_png(head):
    # The signature, then IHDR, which the PNG standard requires to come first.
    return tf.equal(tf.strings.substr(head, 0, 8), _PNG) & tf.equal(
        tf.strings.substr(head, 12, 4), b"IHDR"
    )


def _is_gif(head):
    return tf.equal(tf.strings.substr(head, 0, 3), b"GIF")


def _is_bmp(head):
    return tf.equal(tf.strings.substr(head, 0, 2), b"BM")
