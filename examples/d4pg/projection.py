"""The distributional critic's target: the categorical projection (C51)."""

from __future__ import annotations

import tensorflow as tf


def categorical_projection(support, probabilities, rewards, discounts) -> tf.Tensor:
    """Projects `rewards + discounts * Z` onto the atoms of `support`.

    Each atom `z_j`, carrying probability `p_j`, moves to
    `Tz_j = clip(r + d * z_j, v_min, v_max)` and splits its mass between the two
    nearest atoms in proportion to closeness (Bellemare et al. 2017, Algorithm 1).
    Written as a sum of triangular kernels, `m_i = sum_j p_j * max(0, 1 - |Tz_j -
    z_i| / dz)`, which has no data-dependent indexing, so it is one batched tensor
    expression on every device.

    Args:
        support: The atoms, shape `(num_atoms,)`, evenly spaced and increasing.
        probabilities: The distribution to move, shape `(batch, num_atoms)`.
        rewards: Shape `(batch,)`.
        discounts: Shape `(batch,)`; `0` for a terminal transition.

    Returns:
        The projected probabilities, shape `(batch, num_atoms)`; each row sums to
        the sum of the corresponding row of `probabilities`.

    Raises:
        ValueError: If the shapes disagree or the support has fewer than 2 atoms.

    Example:
    >>> import tensorflow as tf
    >>> p = categorical_projection(
    ...     tf.constant([0.0, 1.0, 2.0]), tf.constant([[0.2, 0.5, 0.3]]),
    ...     tf.constant([0.5]), tf.constant([0.5]))
    >>> [round(float(v), 3) for v in p[0]]
    [0.1, 0.75, 0.15]
    """
    support = tf.convert_to_tensor(support)
    probabilities = tf.convert_to_tensor(probabilities, dtype=support.dtype)
    rewards = tf.convert_to_tensor(rewards, dtype=support.dtype)
    discounts = tf.convert_to_tensor(discounts, dtype=support.dtype)
    num_atoms = support.shape[0]
    if support.shape.rank != 1 or (num_atoms is not None and num_atoms < 2):
        raise ValueError(
            "`support` must be a vector of at least 2 atoms. "
            f"Received: support with shape {support.shape}."
        )
    if probabilities.shape.rank != 2 or not probabilities.shape[1:].is_compatible_with(
        support.shape
    ):
        raise ValueError(
            "`probabilities` must have shape (batch, num_atoms) matching `support`. "
            f"Received: probabilities with shape {probabilities.shape}, support "
            f"with shape {support.shape}."
        )
    for name, value in (("rewards", rewards), ("discounts", discounts)):
        if value.shape.rank != 1 or not value.shape.is_compatible_with(
            probabilities.shape[:1]
        ):
            raise ValueError(
                f"`{name}` must have shape (batch,) matching `probabilities`. "
                f"Received: {name} with shape {value.shape}, probabilities with "
                f"shape {probabilities.shape}."
            )
    v_min, v_max = support[0], support[-1]
    spacing = (v_max - v_min) / tf.cast(tf.size(support) - 1, support.dtype)
    moved = tf.clip_by_value(
        rewards[:, None] + discounts[:, None] * support[None, :], v_min, v_max
    )  # (batch, source atom j)
    # weights[b, i, j]: share of source atom j's mass landing on target atom i.
    weights = tf.nn.relu(
        1.0 - tf.abs(moved[:, None, :] - support[None, :, None]) / spacing
    )
    return tf.reduce_sum(weights * probabilities[:, None, :], axis=-1)
