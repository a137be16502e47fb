"""What every halo layer adds to its Keras parent: tile geometry and the exchange.

The halo layers subclass Keras' own (`HaloConv2D(keras.layers.Conv2D)`, ...) so
they keep its weights, initializers, regularizers and weight order: the wrapped
model's `get_weights()` loads into the partitioned one unchanged. The parent's
`padding` is set to `"valid"` once, in the constructor, and the user's padding
kept in `tile_padding`: the parent's `call` then convolves the extended tile
(`_halo.extend`) with `valid` padding. Nothing is switched during `call`, which
matters because MirroredStrategy traces the replicas in concurrent threads.

The layer's activation is set to `linear` the same way, and the user's kept in
`tile_activation` and applied last, outside the halo machinery: Keras' cross-
entropy losses recover the logits from an output that a `softmax` / `sigmoid`
made (`_keras_logits`, or a `Softmax` op), and otherwise clip the probabilities
to `[epsilon, 1 - epsilon]`. A final activation inside the recompute wrapper (or
before the transposed convolution's crop) hid it, so a partitioned model's loss
and gradient were the clipped ones wherever a probability fell below 1e-7
(issue 53: keras-io's full-depth U-Net trained on another loss than one device).
"""

from __future__ import annotations

import keras

from keras_replicator._arguments import check_int
from keras_replicator.spatial import _geometry, _halo, _recompute


def check_parts(layer, parts: int) -> None:
    """Validates `parts` and the channels-last layout every spatial layer needs."""
    check_int("parts", parts)
    if getattr(layer, "data_format", "channels_last") != "channels_last":
        raise ValueError(
            f"Layer `{layer.name}`: spatial partitioning needs "
            "`data_format='channels_last'`. Received: "
            f"data_format={layer.data_format!r}."
        )


class TiledMixin:
    """Geometry and halo exchange for a 2-D sliding-window Keras layer.

    Takes the parent's arguments plus `parts`; `call` runs the parent on the
    extended tile.
    """

    _fill = 0.0

    def __init__(self, *args, parts: int = 2, **kwargs):
        super().__init__(*args, **kwargs)
        check_parts(self, parts)
        self.parts = parts
        self.tile_padding = self.padding
        self.padding = "valid"
        self.tile_activation = getattr(self, "activation", None)
        if self.tile_activation is not None:
            self.activation = keras.activations.linear

    def call(self, inputs):
        outputs = self._window_call(inputs)
        if self.tile_activation is None:
            return outputs
        return self.tile_activation(outputs)

    def _window_call(self, inputs):
        plan = self._plan(inputs.shape[1])
        width_window = self._width_window()
        if _halo.is_identity(plan, width_window, inputs.shape):
            return self._parent_call(inputs)  # no halo, no padding: nothing to keep
        if self.compute_dtype != self.variable_dtype:  # see `_recompute`
            return self._parent_call(self._extend(inputs))
        received = _halo.exchange(inputs, plan, self.parts, self._fill)
        halos = [h for h in received if h is not None]

        def assemble(tile, *halos):
            above, below = halos if halos else (None, None)
            return _halo.assemble(
                tile, above, below, plan, width_window, self.parts, self._fill
            )

        return _recompute.without_keeping_input(
            self._parent_call, assemble, inputs, halos
        )

    def _parent_call(self, inputs):
        """The Keras parent's `call` (the window op) on an already extended tile."""
        return super().call(inputs)

    def _window_shape(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """`(size, dilation)` per spatial axis; pooling layers override."""
        return tuple(self.kernel_size), tuple(self.dilation_rate)

    def _windows(self) -> tuple[_geometry.Window, _geometry.Window]:
        sizes, dilations = self._window_shape()
        return tuple(
            _geometry.Window(d * (k - 1) + 1, s, self.tile_padding)
            for k, d, s in zip(sizes, dilations, self.strides)
        )

    def _width_window(self) -> _geometry.Window:
        """The window whose `same` padding `_halo.assemble` adds along the width."""
        return self._windows()[1]

    def _plan(self, tile_rows: int) -> _geometry.Halo:
        rows_window, _ = self._windows()
        return _geometry.halo(rows_window, tile_rows, self.parts, self.name)

    def _extended_shape(self, input_shape):
        batch, rows, width, channels = input_shape
        plan = self._plan(rows)
        left, right = self._width_window().pads(width)
        return (batch, plan.length, width + left + right, channels)

    def _extend(self, inputs):
        return _halo.extend(
            inputs,
            self._plan(inputs.shape[1]),
            self._width_window(),
            self.parts,
            fill=self._fill,
        )

    def compute_output_shape(self, input_shape):
        return super().compute_output_shape(self._extended_shape(input_shape))

    def get_config(self):
        config = super().get_config()
        config["padding"] = self.tile_padding
        if self.tile_activation is not None:
            config["activation"] = keras.activations.serialize(self.tile_activation)
        config["parts"] = self.parts
        return config
