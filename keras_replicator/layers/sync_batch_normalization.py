"""`SyncBatchNormalization`: batch statistics over groups of replicas.

Ying et al. (2018) and MLPerf v0.6 compute batch-norm statistics over groups of a
few replicas, so the batch that normalises each example stays near the small-batch
optimum however many replicas train. Keras' `BatchNormalization(synchronized=True)`
can only use all replicas, so this layer keeps everything of Keras' layer (moving
statistics, masking, mixed precision, serialisation) and replaces how the training
moments are computed: through `keras_replicator.replica.all_reduce` with
`group_size`.

The moments are two-pass: the group mean first, then the mean squared deviation
from it (two small all-reduces). The one-pass `E[x^2] - E[x]^2` that Keras' own
synchronized moments use loses digits when activations are large relative to their
spread, which is common after float16 layers.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_replicator import _compat, replica


@keras.saving.register_keras_serializable(package="keras_replicator")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization with statistics over groups of `group_size` replicas.

    A drop-in for `keras.layers.BatchNormalization`: same arguments and weights,
    so checkpoints move between the two. In training, the mean and the (biased)
    variance are those of the concatenated batches of the `group_size` consecutive
    replicas this replica belongs to. Moving statistics are updated as Keras does,
    with the update averaged over all replicas, so every replica keeps the same
    moving statistics (the average of the groups').

    Args:
        group_size: Replicas per statistics group. `None` uses all replicas, `1`
            each replica's own batch (plain `BatchNormalization`). Must divide the
            number of replicas; with fewer replicas than `group_size` (e.g. one
            device) all replicas form one group. Defaults to `None`.
        **kwargs: Arguments of `keras.layers.BatchNormalization` (except
            `synchronized` and `renorm`).

    Example:
    >>> import keras, keras_replicator as kr
    >>> layer = kr.layers.SyncBatchNormalization(group_size=2)
    >>> tuple(layer(keras.ops.ones((4, 3)), training=True).shape)
    (4, 3)

    References:
        Ying et al. 2018, "Image Classification at Supercomputer Scale".
    """

    def __init__(self, group_size: int | None = None, **kwargs):
        if kwargs.pop("synchronized", False):
            raise ValueError(
                "`synchronized` is implied by `SyncBatchNormalization`. Received: "
                "synchronized=True. Use `group_size` to choose the replicas."
            )
        if kwargs.get("renorm"):
            raise ValueError(
                "`renorm` is not supported by `SyncBatchNormalization`. Received: "
                "renorm=True. Use `keras.layers.BatchNormalization` for renorm."
            )
        if group_size is not None and (
            isinstance(group_size, bool)
            or not isinstance(group_size, int)
            or group_size < 1
        ):
            raise ValueError(
                "`group_size` must be a positive integer or None. "
                f"Received: group_size={group_size!r}."
            )
        super().__init__(**kwargs)
        self.group_size = group_size

    def add_weight(self, *args, **kwargs):
        # Groups see different statistics; averaging the moving statistics' updates
        # over all replicas keeps every replica's copy identical (Keras' default,
        # aggregation "none", leaves each replica with its own group's values).
        if kwargs.get("name") in ("moving_mean", "moving_variance"):
            kwargs["aggregation"] = "mean"
        return super().add_weight(*args, **kwargs)

    def _moments(self, inputs, mask):  # Keras' hook; see _compat.check_upstream.
        axes = self._reduction_axes
        if mask is None:
            weights = ops.ones_like(inputs)
        else:
            weights = ops.broadcast_to(
                ops.cast(ops.expand_dims(mask, axis=-1), inputs.dtype),
                ops.shape(inputs),
            )
        group_size = self.group_size
        if group_size is not None and group_size >= replica.num_replicas():
            group_size = None  # fewer replicas than a group: one group of all
        count = replica.all_reduce(ops.sum(weights, axis=axes), group_size=group_size)
        total = replica.all_reduce(
            ops.sum(inputs * weights, axis=axes), group_size=group_size
        )
        mean = ops.divide_no_nan(total, count)
        centred = (inputs - _expand(mean, inputs, axes)) * weights
        squares = replica.all_reduce(
            ops.sum(ops.square(centred), axis=axes), group_size=group_size
        )
        return mean, ops.divide_no_nan(squares, count)

    def get_config(self):
        config = super().get_config()
        config.pop("synchronized", None)
        config.pop("renorm", None)
        config.pop("renorm_clipping", None)
        config.pop("renorm_momentum", None)
        config["group_size"] = self.group_size
        return config


def _expand(statistic, inputs, axes):
    shape = [1 if i in axes else inputs.shape[i] for i in range(len(inputs.shape))]
    return ops.reshape(statistic, shape)


_compat.register_batch_norm_moments_hook()
