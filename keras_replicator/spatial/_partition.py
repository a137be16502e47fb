"""`kr.spatial.partition`: a Keras conv model with each image split across replicas.

Spatial partitioning (Kumar et al. 2019, the MLPerf-0.6 TPU-pod submissions) splits
every image along its height over a group of `parts` consecutive replicas, so a
model whose batch cannot grow, or whose activations do not fit one device, still
scales. `partition` rebuilds the user's model on a tile-sized input (`_clone`
chooses each layer's replacement), loads its weights, and compiles it like the
original inside the strategy's scope. The returned `SpatialModel` is the rebuilt
functional model plus the input pipeline's tiling (`_images`): `fit`, `evaluate`
and `predict` take whole images, as the original model did.

Groups compose with data parallelism: on `n` replicas there are `n // parts`
groups, each training on its share of the global batch. No change to the
gradient reduction is needed (`_images` explains why the library's
sample-weighted mean is already exact).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_replicator import _compat
from keras_replicator._arguments import check_int
from keras_replicator.spatial import _clone, _images, _saving


class SpatialModel(keras.Model):
    """A functional model whose replicas each hold one height tile of an image.

    Made by `kr.spatial.partition`; `fit`, `evaluate` and `predict` take whole
    images (a batched `tf.data.Dataset` or arrays) and tile them per replica. The
    model cannot be called on whole images directly: its layers exchange rows
    with the neighbouring replicas, so it runs only inside the strategy's steps.
    """

    def __init__(self, inputs, outputs, *, parts: int, groups: int, **kwargs):
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self.parts = parts
        self.groups = groups
        self.tiled_outputs = any(len(o.shape) == 4 for o in self.outputs)
        self.__dict__["_unpartitioned_model"] = None  # set by `partition`, untracked

    def unpartitioned(self) -> keras.Model:
        """The original model, with this model's weights and optimizer state.

        What `save` and `save_weights` write: it runs on whole images on one
        device, and `kr.spatial.partition` of it (or of a model loaded from its
        file) continues training exactly. The model given to `partition` is
        updated in place (weights, and compiled like this model if it was not),
        so callbacks that save (`ModelCheckpoint`) update it too.

        Raises:
            ValueError: for a `SpatialModel` not made by `kr.spatial.partition`.

        Example:
        >>> import keras, keras_replicator as kr
        >>> strategy = kr.MultiDeviceReplicator(num_replicas=2)
        >>> model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(
        ...     2, 3, padding="same"), keras.layers.GlobalAveragePooling2D()])
        >>> spatial = kr.spatial.partition(model, 2, strategy=strategy)
        >>> spatial.unpartitioned().input_shape
        (None, 8, 8, 1)
        """
        model = self._original()
        model.set_weights(self.get_weights())
        _saving.compile_like(self, model)
        _saving.copy_optimizer_state(self, model)
        return model

    def save(self, filepath, overwrite=True, **kwargs):
        """Saves `unpartitioned()` (see `keras.Model.save`): loadable anywhere."""
        return self.unpartitioned().save(filepath, overwrite=overwrite, **kwargs)

    def save_weights(self, filepath, overwrite=True, **kwargs):
        """Saves `unpartitioned()`'s weights, which the original model loads."""
        return self.unpartitioned().save_weights(
            filepath, overwrite=overwrite, **kwargs
        )

    def load_weights(self, filepath, **kwargs):
        """Loads weights (and optimizer state) saved by either model."""
        model = self._original()
        _saving.compile_like(self, model)
        model.load_weights(filepath, **kwargs)
        self.set_weights(model.get_weights())
        _saving.copy_optimizer_state(model, self)

    def _original(self) -> keras.Model:
        model = self.__dict__["_unpartitioned_model"]
        if model is None:
            raise ValueError(
                "Saving and loading need the model that was partitioned, which only "
                "`kr.spatial.partition` records. Received: a SpatialModel "
                f"`{self.name}` built directly. Make it with "
                "`kr.spatial.partition(model, parts)`."
            )
        return model

    def tile_dataset(self, x, y=None, sample_weight=None, batch_size=None):
        """Whole-image global batches rearranged for the replicas, for custom loops.

        What `fit` feeds the strategy: distribute the result with
        `strategy.experimental_distribute_dataset` and each replica receives its
        tile of its group's images (targets repeated, or tiled for image-shaped
        outputs). Then call the model inside `strategy.run_steps`.

        Args:
            x: Whole images `[n, height, width, channels]`, or a batched
                `tf.data.Dataset` of whole-image batches (with their targets).
            y: Targets for array `x`. Defaults to `None`.
            sample_weight: Sample weights for array `x`. Defaults to `None`.
            batch_size: Global batch, in images, for array `x`. Defaults to 32.

        Returns:
            A batched `tf.data.Dataset` of `parts` times as many rows of height
            `height / parts`.

        Example:
        >>> import keras, numpy as np, keras_replicator as kr
        >>> strategy = kr.MultiDeviceReplicator(num_replicas=2)
        >>> model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(
        ...     2, 3, padding="same"), keras.layers.GlobalAveragePooling2D()])
        >>> spatial = kr.spatial.partition(model, 2, strategy=strategy)
        >>> tiles = spatial.tile_dataset(np.zeros((4, 8, 8, 1)), batch_size=4)
        >>> tiles.element_spec.shape.as_list()
        [None, 4, 8, 1]
        """
        return self._tiles(x, y, sample_weight, batch_size)

    def _tiles(self, x, y=None, sample_weight=None, batch_size=None, shuffle=False):
        dataset = _images.as_dataset(x, y, sample_weight, batch_size, shuffle)
        return _images.to_tiles(dataset, self.parts, self.groups, self.tiled_outputs)

    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        *,
        sample_weight=None,
        shuffle=True,
        validation_data=None,
        validation_batch_size=None,
        **kwargs,
    ):
        if kwargs.get("validation_split"):
            raise ValueError(
                "`validation_split` is not supported by a partitioned model. "
                f"Received: validation_split={kwargs['validation_split']}. Pass "
                "`validation_data` instead."
            )
        data = self._tiles(x, y, sample_weight, batch_size, shuffle)
        if validation_data is not None:
            if not isinstance(validation_data, tf.data.Dataset):
                validation_data = (*validation_data, None, None)[:3]
            else:
                validation_data = (validation_data, None, None)
            validation_data = self._tiles(
                *validation_data, validation_batch_size or batch_size
            )
        return super().fit(
            data, validation_data=validation_data, shuffle=False, **kwargs
        )

    def evaluate(self, x=None, y=None, batch_size=None, *, sample_weight=None, **kw):
        return super().evaluate(self._tiles(x, y, sample_weight, batch_size), **kw)

    def predict(self, x, batch_size=None, **kwargs):
        return super().predict(self._tiles(x, batch_size=batch_size), **kwargs)

    def predict_step(self, data):
        return _images.whole_outputs(super().predict_step(data), self.parts)


def partition(
    model: keras.Model,
    parts: int,
    axis: str = "height",
    *,
    strategy: tf.distribute.Strategy | None = None,
) -> SpatialModel:
    """Splits every image of `model` along its height over groups of replicas.

    Replicas `0..parts-1` share the first images of each global batch, the next
    `parts` replicas the next images, and so on; each holds `1/parts` of every
    activation before global pooling. Convolutions and pooling exchange halo rows
    with their neighbours, batch normalization takes its statistics over the group
    (times the model's own batch group), global pooling reduces over the group and
    the layers after it run replicated within the group. Training gives the
    weights of the unpartitioned model trained on the same global batches.

    Args:
        model: A Sequential or functional Keras model with one image input
            `(height, width, channels)` (channels last), with its weights. If it
            is compiled, the result is compiled the same way (with an optimizer
            of its own, holding `model`'s optimizer state if it has one, e.g.
            after `keras.models.load_model`; and `jit_compile=False`: the halo
            collectives cannot be compiled by XLA here). The result's `save`
            writes `model` with the trained weights (`SpatialModel.unpartitioned`).
        parts: Replicas (tiles) per image; must divide the number of replicas.
        axis: The axis to split. Only `"height"` is supported. Defaults to
            `"height"`.
        strategy: A Replicator strategy. Defaults to the strategy whose scope is
            active.

    Returns:
        A `SpatialModel`, built in the strategy's scope, with `model`'s weights
        (same `get_weights` order).

    Raises:
        ValueError: For a height not divisible by `parts` times the accumulated
            strides, or a layer that cannot be partitioned (both named).

    Example:
    >>> import keras, keras_replicator as kr
    >>> strategy = kr.MultiDeviceReplicator(num_replicas=2)
    >>> model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(
    ...     2, 3, padding="same"), keras.layers.GlobalAveragePooling2D()])
    >>> kr.spatial.partition(model, 2, strategy=strategy).input_shape
    (None, 4, 8, 1)

    References:
        Kumar et al. 2019, "Scale MLPerf-0.6 models on Google TPU-v3 Pods".
    """
    check_int("parts", parts)
    if axis != "height":
        raise ValueError(
            f"`axis` must be 'height'. Received: axis={axis!r}. To split the "
            "width, transpose the images (and the model) so the width is axis 1."
        )
    strategy = strategy or tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    if not _compat.is_replicator(strategy) and replicas > 1:
        raise TypeError(
            "`strategy` must be a keras_replicator strategy. Received: "
            f"{type(strategy).__name__}. Use e.g. `kr.MultiDeviceReplicator`."
        )
    if replicas % parts:
        raise ValueError(
            f"`parts` must divide the {replicas} replicas. Received: parts={parts}."
        )
    input_shape = _image_shape(model)
    height = input_shape[0]
    if height % parts:
        raise ValueError(
            f"The input height {height} of model `{model.name}` must be divisible "
            f"by `parts`. Received: parts={parts}. Resize or pad the images."
        )
    with strategy.scope():
        tile = keras.Input(
            (height // parts, *input_shape[1:]),
            dtype=model.inputs[0].dtype,
            name=model.inputs[0].name,
        )
        clone = keras.models.clone_model(
            model, input_tensors=tile, clone_function=_clone.clone_function(parts)
        )
        result = SpatialModel(
            clone.inputs,
            clone.outputs,
            parts=parts,
            groups=replicas // parts,
            name=model.name,
        )
        result.set_weights(model.get_weights())
        result.__dict__["_unpartitioned_model"] = model
        if model.compiled:
            config = model.get_compile_config()
            config["jit_compile"] = False
            result.compile_from_config(config)
            _saving.copy_optimizer_state(model, result)
    return result


def _image_shape(model) -> tuple[int, int, int]:
    if not isinstance(model, keras.Model) or not hasattr(model, "inputs"):
        raise TypeError(
            "`model` must be a Sequential or functional Keras model. Received: "
            f"{type(model).__name__}."
        )
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    if not inputs or len(inputs) != 1 or len(inputs[0].shape) != 4:
        raise ValueError(
            f"`model` must take one image input `(height, width, channels)`. "
            f"Received: model `{model.name}` with inputs {inputs!r}. Give the "
            "model a `keras.Input((height, width, channels))`."
        )
    shape = tuple(inputs[0].shape[1:])
    if shape[0] is None:
        raise ValueError(
            f"The input height of model `{model.name}` must be known. Received: "
            f"input shape {shape}."
        )
    return shape
