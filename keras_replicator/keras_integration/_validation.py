"""Early, clear errors for the two commonest misuses of a strategy with Keras."""

from __future__ import annotations

import tensorflow as tf
from keras import tree


def check_model_in_scope(model, strategy) -> None:
    """Raises if the model's variables were not created under `strategy`.

    A random layer's seed-generator state (`keras.layers.RandomFlip`,
    `RandomRotation`, ... made outside the scope, as the keras-io EfficientNet
    fine-tuning example does) is accepted: it only draws random numbers, so each
    replica advancing one unsynchronised copy changes which augmentations are
    drawn, never the weights' arithmetic; stock strategies train such models too.
    Every other variable made outside the scope (weights, batch-norm statistics)
    is an error.
    """
    outside = [
        v.path
        for v in model.variables
        if not strategy.extended.variable_created_in_scope(v.value)
        and not _is_seed_state(v)
    ]
    if outside:
        raise ValueError(
            f"The model's variables were created outside the scope of {strategy!r} "
            f"and cannot be trained by it. Received: variables {outside[:3]}"
            f"{' ...' if len(outside) > 3 else ''}. Build and compile the model "
            "inside `with strategy.scope():` (or load it there with "
            "`keras.models.load_model`)."
        )


def _is_seed_state(variable) -> bool:
    """Whether `variable` is a `keras.random.SeedGenerator`'s state.

    Keras names that variable `seed_generator_state` and makes it non-trainable
    with no aggregation (keras/src/random/seed_generator.py).
    """
    return (
        not variable.trainable
        and variable.name == "seed_generator_state"
        and getattr(variable, "aggregation", None) in (None, "none")
    )


def check_batch_covers_replicas(batch, strategy, batch_size=None) -> None:
    """Raises if a full (first) batch leaves a replica of `strategy` with no samples."""
    leaves = [v for v in tree.flatten(batch) if v is not None]
    if not leaves or not isinstance(leaves[0], tf.distribute.DistributedValues):
        return
    rows = [
        int(v.shape[0]) if v.shape.rank else 1
        for v in strategy.experimental_local_results(leaves[0])
    ]
    if min(rows) > 0:
        return
    replicas = strategy.num_replicas_in_sync
    received = sum(rows) if batch_size is None else batch_size
    raise ValueError(
        f"The global batch must hold at least one sample per replica ({replicas} "
        f"replicas), but a replica received none. Received: batch_size={received} "
        f"(this worker's share of the first batch: {sum(rows)}). Use a batch size of "
        f"at least {replicas}, ideally a multiple of {replicas}."
    )


def check_global_batch_size(batch_size, strategy) -> None:
    """Raises if a known global `batch_size` leaves some replica without samples."""
    replicas = strategy.num_replicas_in_sync
    if batch_size is None or batch_size >= replicas:
        return
    raise ValueError(
        f"The global batch must hold at least one sample per replica ({replicas} "
        f"replicas). Received: batch_size={batch_size}. Use a batch size of at "
        f"least {replicas}, ideally a multiple of {replicas}."
    )
