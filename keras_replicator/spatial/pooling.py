"""Pooling on one height tile: windowed pooling with a halo, global pooling as a
group reduction.

`HaloMaxPooling2D` and `HaloAveragePooling2D` extend the tile like the
convolutions do (`_halo.extend`), with two differences that TensorFlow's `same`
padding imposes: max pooling never picks a padded value, so rows and columns
beyond the image are `-inf`; average pooling divides each window's sum by the
pixels inside the image only, so the count comes from pooling a 0/1 mask of the
extended tile (no collective: the mask depends only on the tile's position).

`GroupGlobalAveragePooling2D` sums its tile, adds the group's sums with one
grouped `all_reduce` and divides by the whole image's pixel count, so every
replica of a group holds the same pooled features; the layers after it (the
head) then run replicated within the group. `GroupGlobalMaxPooling2D` reduces
with `max`.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_replicator import replica
from keras_replicator.spatial import _halo
from keras_replicator.spatial._tiled import TiledMixin, check_parts


class _PoolingMixin(TiledMixin):
    def _window_shape(self):
        return tuple(self.pool_size), (1, 1)


@keras.saving.register_keras_serializable(package="keras_replicator")
class HaloMaxPooling2D(_PoolingMixin, keras.layers.MaxPooling2D):
    """`keras.layers.MaxPooling2D` on one height tile of `parts`.

    Args:
        *args: Arguments of `keras.layers.MaxPooling2D`.
        parts: Replicas (tiles) per image. Defaults to `2`.
        **kwargs: Keyword arguments of `keras.layers.MaxPooling2D`.

    Example:
    >>> import keras_replicator as kr
    >>> layer = kr.spatial.HaloMaxPooling2D(3, strides=2, padding="same", parts=1)
    >>> layer.compute_output_shape((None, 8, 8, 3))
    (None, 4, 4, 3)
    """

    _fill = float("-inf")


@keras.saving.register_keras_serializable(package="keras_replicator")
class HaloAveragePooling2D(_PoolingMixin, keras.layers.AveragePooling2D):
    """`keras.layers.AveragePooling2D` on one height tile of `parts`.

    Args:
        *args: Arguments of `keras.layers.AveragePooling2D`.
        parts: Replicas (tiles) per image. Defaults to `2`.
        **kwargs: Keyword arguments of `keras.layers.AveragePooling2D`.

    Example:
    >>> import keras_replicator as kr
    >>> layer = kr.spatial.HaloAveragePooling2D(2, parts=1)
    >>> layer.compute_output_shape((None, 8, 8, 3))
    (None, 4, 4, 3)
    """

    def call(self, inputs):
        pooled = super().call(inputs)  # the window sums, memory-lean (`_recompute`)
        if self.tile_padding != "same":
            return pooled
        rows, width = inputs.shape[1], inputs.shape[2]
        mask = _halo.inside_mask(
            self._plan(rows), self._windows()[1], rows, width, self.parts, pooled.dtype
        )
        return pooled / self._parent_call(mask)


class _GroupGlobalMixin:
    def _init_parts(self, parts: int) -> None:
        check_parts(self, parts)
        self.parts = parts

    def _reduce(self, value, op):
        if self.parts == 1:
            return value
        reduced = replica.all_reduce(value, op, group_size=self.parts)
        reduced.set_shape(value.shape)  # the grouped collective loses it
        return reduced

    def _finish(self, value):
        return value if self.keepdims else tf.squeeze(value, axis=[1, 2])

    def get_config(self):
        return {**super().get_config(), "parts": self.parts}


@keras.saving.register_keras_serializable(package="keras_replicator")
class GroupGlobalAveragePooling2D(
    _GroupGlobalMixin, keras.layers.GlobalAveragePooling2D
):
    """The mean over a whole image whose height tiles sit on a group of replicas.

    Args:
        parts: Replicas (tiles) per image. Defaults to `2`.
        **kwargs: Keyword arguments of `keras.layers.GlobalAveragePooling2D`.

    Example:
    >>> import keras_replicator as kr
    >>> kr.spatial.GroupGlobalAveragePooling2D(parts=1).compute_output_shape(
    ...     (None, 8, 8, 3))
    (None, 3)
    """

    def __init__(self, parts: int = 2, **kwargs):
        super().__init__(**kwargs)
        self._init_parts(parts)

    def call(self, inputs, mask=None):
        if mask is not None:
            raise ValueError(
                f"Layer `{self.name}` does not support masks. Received: a mask."
            )
        total = self._reduce(tf.reduce_sum(inputs, axis=[1, 2], keepdims=True), "sum")
        pixels = inputs.shape[1] * self.parts * inputs.shape[2]
        return self._finish(total / tf.cast(pixels, inputs.dtype))


@keras.saving.register_keras_serializable(package="keras_replicator")
class GroupGlobalMaxPooling2D(_GroupGlobalMixin, keras.layers.GlobalMaxPooling2D):
    """The maximum over a whole image whose height tiles sit on a group of replicas.

    Args:
        parts: Replicas (tiles) per image. Defaults to `2`.
        **kwargs: Keyword arguments of `keras.layers.GlobalMaxPooling2D`.

    Example:
    >>> import keras_replicator as kr
    >>> kr.spatial.GroupGlobalMaxPooling2D(parts=1).compute_output_shape(
    ...     (None, 8, 8, 3))
    (None, 3)
    """

    def __init__(self, parts: int = 2, **kwargs):
        super().__init__(**kwargs)
        self._init_parts(parts)

    def call(self, inputs):
        local = tf.reduce_max(inputs, axis=[1, 2], keepdims=True)
        return self._finish(self._reduce(local, "max"))
