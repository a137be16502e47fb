"""Whole images in, tiles per replica out; and the way back for predictions.

The user feeds whole images with a global batch of `b`. The strategy splits each
global batch evenly over its replicas in replica order, so the input pipeline
rearranges every batch before distribution: `[b, H, W, C]` becomes
`[groups, parts, b/groups, H/parts, W, C]` flattened to `parts*b` rows of height
`H/parts`. Replica `r` then receives the `b/groups` images of group `r // parts`,
cut to tile `r % parts`: no replica ever holds a whole image. Labels and sample
weights are repeated `parts` times, so every replica of a group computes the
group's loss (on the same images) and declares the same sample count.

Why the gradient reduction needs no change: each replica's sample count is its
group's image count, so the library's sample-weighted mean counts every group
`parts` times and divides by `parts` times the image count. A head weight's
gradient is the same on every replica of a group: the mean is the data-parallel
one. A convolution's gradient on one replica is only its tile's share, but the
backward pass of the halo collectives sums all replicas' losses, which hold the
group's loss `parts` times: the group's shares add up to `parts` times the
whole-image gradient, again divided away by the mean.

Predictions travel back in `predict_step`: pooled outputs (identical within a
group) are kept by the group's first replica only, tiled outputs are gathered
along the height there, so `predict` returns one row per image in input order.
"""

from __future__ import annotations

import tensorflow as tf
from keras import tree

from keras_replicator import replica


def as_dataset(x, y=None, sample_weight=None, batch_size=None, shuffle=False):
    """`x` (and `y`, `sample_weight`) as a batched `tf.data.Dataset`."""
    if isinstance(x, tf.data.Dataset):
        if y is not None or sample_weight is not None:
            raise ValueError(
                "`y` and `sample_weight` must be None when `x` is a dataset. "
                "Received: y or sample_weight. Put them in the dataset's elements."
            )
        return x
    parts = tuple(v for v in (x, y, sample_weight) if v is not None)
    dataset = tf.data.Dataset.from_tensor_slices(parts if len(parts) > 1 else x)
    if shuffle:
        count = len(tree.flatten(x)[0])
        dataset = dataset.shuffle(count, reshuffle_each_iteration=True)
    return dataset.batch(batch_size or 32)


def to_tiles(
    dataset: tf.data.Dataset, parts: int, groups: int, tile_targets: bool = False
) -> tf.data.Dataset:
    """Maps whole-image batches to the per-replica tile layout (module docstring).

    With `tile_targets` (a model whose output is an image, e.g. segmentation),
    targets and sample weights are cut into height tiles like the images;
    otherwise each group's are repeated on its `parts` replicas.
    """

    def split(*element):
        x, rest = element[0], element[1:]
        _check_images(x)
        images = tf.shape(x)[0]
        tf.debugging.assert_equal(
            images % groups,
            0,
            message=(
                f"Every batch must hold a multiple of {groups} images (one share per "
                f"group of {parts} replicas). Batch the dataset with "
                "`drop_remainder=True` or choose a batch size divisible by the "
                "number of groups."
            ),
        )
        per_group = images // groups
        spread = _tile if tile_targets else _repeat
        tiles = _tile(x, parts, groups, per_group)
        repeated = tree.map_structure(
            lambda v: spread(v, parts, groups, per_group), rest
        )
        return (tiles, *repeated) if rest else tiles

    return dataset.map(split, num_parallel_calls=tf.data.AUTOTUNE)


def _tile(value, parts, groups, per_group):
    """`[b, H, ...]` -> `[groups * parts * per_group, H / parts, ...]`."""
    value = tf.convert_to_tensor(value)
    if value.shape.rank < 2 or value.shape[1] is None or value.shape[1] % parts:
        raise ValueError(
            f"Targets of an image-shaped output must have a height divisible by "
            f"`parts`={parts}. Received: shape {value.shape}."
        )
    rows = value.shape[1] // parts
    rest = tf.shape(value)[2:]
    grouped = tf.reshape(value, tf.concat([[groups, per_group, parts, rows], rest], 0))
    order = [0, 2, 1, 3] + list(range(4, value.shape.rank + 2))
    tiles = tf.reshape(tf.transpose(grouped, order), tf.concat([[-1, rows], rest], 0))
    tiles.set_shape([None, rows, *value.shape[2:]])
    return tiles


def _check_images(x):
    if not tf.is_tensor(x) or x.shape.rank != 4 or x.shape[1] is None:
        raise ValueError(
            "A partitioned model's input must be one batch of images "
            "`[batch, height, width, channels]` with a known height. Received: "
            f"{x!r}."
        )


def _repeat(value, parts, groups, per_group):
    """`[b, ...]` -> `[groups * parts * per_group, ...]`, each group's rows repeated."""
    value = tf.convert_to_tensor(value)
    shape = tf.shape(value)[1:]
    grouped = tf.reshape(value, tf.concat([[groups, 1, per_group], shape], 0))
    multiples = tf.concat([[1, parts, 1], tf.ones_like(shape)], 0)
    return tf.reshape(tf.tile(grouped, multiples), tf.concat([[-1], shape], 0))


def whole_outputs(outputs, parts: int):
    """In a replica: the rows this replica contributes to `predict`'s result.

    Tiled (rank-4) outputs are gathered into whole images; the group's first
    replica returns them, the others return no rows.
    """
    if parts == 1:
        return outputs
    first = tf.equal(replica.replica_id() % parts, 0)

    def one(value):
        if len(value.shape) == 4:
            value = replica.all_gather(value, axis=1, group_size=parts)
        keep = tf.where(first, tf.shape(value)[0], 0)
        return value[:keep]

    return tree.map_structure(one, outputs)
