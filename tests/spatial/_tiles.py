"""Runs a layer tile-by-tile on replicas and compares with the whole-image layer."""

import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.spatial import _geometry

# (replicas, parts) of the layer tests: 2 groups of 2 in the fast run; 2 and 4
# tiles of one image in the slow run.
LAYOUTS = [
    pytest.param(2, 2, marks=pytest.mark.slow),
    (4, 2),
    pytest.param(4, 4, marks=pytest.mark.slow),
]
IMAGES_PER_GROUP = 2
WIDTH = 7
CHANNELS = 3


def pick_height(window_rows, parts, minimum=8):
    """The smallest height >= `minimum` that `window_rows` partitions into `parts`."""
    for height in range(minimum, 64):
        if height % parts:
            continue
        try:
            _geometry.halo(window_rows, height // parts, parts, "probe")
        except ValueError:
            continue
        return height
    pytest.skip(f"no height splits {window_rows} into {parts} equal output tiles")


def split(array, groups, parts):
    """`[groups*b, H, ...]` -> per replica `[b, H/parts, ...]`, in replica order.

    Arrays that are not images (pooled outputs) are repeated on each replica of
    their group instead.
    """
    out = []
    for g in range(groups):
        images = array[g * IMAGES_PER_GROUP : (g + 1) * IMAGES_PER_GROUP]
        if array.ndim == 4 and array.shape[1] > 1:
            out.extend(np.split(images, parts, axis=1))
        else:
            out.extend([images] * parts)
    return out


def run_tiles(strategy, layer, x, upstream, parts):
    """Per replica: `(output tile, input-gradient tile, weight gradients)`.

    The loss is `sum(output * upstream)` over the whole batch, so the summed
    per-replica gradients are the whole-image layer's gradients.
    """
    replicas = strategy.num_replicas_in_sync
    groups = replicas // parts
    x_tiles = tf.constant(np.stack(split(x, groups, parts)))
    up_tiles = tf.constant(np.stack(split(upstream, groups, parts)))

    @tf.function
    def step():
        def replica_fn():
            index = tf.distribute.get_replica_context().replica_id_in_sync_group
            tile = tf.gather(x_tiles, index)
            with tf.GradientTape() as tape:
                tape.watch(tile)
                out = layer(tile)
                loss = tf.reduce_sum(out * tf.gather(up_tiles, index))
            grads = tape.gradient(loss, [tile] + layer.trainable_variables)
            return out, grads[0], grads[1:]

        return strategy.run(replica_fn)

    out, dx, dw = step()
    local = strategy.experimental_local_results
    return (
        [v.numpy() for v in local(out)],
        [v.numpy() for v in local(dx)],
        [[v.numpy() for v in local(g)] for g in dw],
    )


def reference(layer, x, upstream):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = layer(x)
        loss = tf.reduce_sum(out * upstream)
    grads = tape.gradient(loss, [x] + layer.trainable_variables)
    return out.numpy(), grads[0].numpy(), [g.numpy() for g in grads[1:]]


def stitch(tiles, groups, parts):
    """Inverse of `split`."""
    images = []
    for g in range(groups):
        images.append(np.concatenate(tiles[g * parts : (g + 1) * parts], axis=1))
    return np.concatenate(images, axis=0)
