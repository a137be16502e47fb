"""Keras' `Lamb` step, cut where it takes its two norms (weight-update sharding).

Under `kr.AllReduceOptions(shard_weight_update=True)` a replica updates one piece
of each variable, but Lamb's trust ratio needs the norms of the whole variable and
of its whole Adam update. `keras.optimizers.Lamb.update_step` computes both inside
one call and offers no hook, so this module repeats its arithmetic in two halves:
`partial_squares` (the moments' update and this piece's sums of squares) and
`finish` (the ratio from the summed squares, and the step). It reads Lamb's slot
lists (`_momentums`, `_velocities`), which have no public name. `DIGESTS` pins the
source of the Keras method mirrored here: `check_upstream()` fails if it changes,
and tests/sharding/test_norm_optimizers.py compares the two numerically. No
upstream issue: Keras 3 shards optimizer state only on JAX.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_replicator._compat._patching import changed_digests

# Source digests of the Keras methods mirrored here, for keras==3.15.1.
DIGESTS = {
    "Lamb.update_step": "be61e254012b60f5",
    "Lamb.build": "7a8532bc7f86d48b",
}


def check_upstream() -> dict[str, str]:
    """{name: what changed} for the Lamb methods this module mirrors."""
    return changed_digests(
        DIGESTS,
        {
            "Lamb.update_step": keras.optimizers.Lamb.update_step,
            "Lamb.build": keras.optimizers.Lamb.build,
        },
    )


def partial_squares(optimizer, gradient, variable):
    """Updates the moments of `variable` (a piece); returns `(squares, update)`.

    `squares` is `[sum(w**2), sum(update**2)]` over this piece.
    """
    dtype = variable.dtype
    gradient = ops.cast(gradient, dtype)
    local_step = ops.cast(optimizer.iterations + 1, dtype)
    beta_1_power = ops.power(ops.cast(optimizer.beta_1, dtype), local_step)
    beta_2_power = ops.power(ops.cast(optimizer.beta_2, dtype), local_step)
    index = optimizer._get_variable_index(variable)
    m = optimizer._momentums[index]
    v = optimizer._velocities[index]
    optimizer.assign_add(
        m, ops.multiply(ops.subtract(gradient, m), 1 - optimizer.beta_1)
    )
    optimizer.assign_add(
        v,
        ops.multiply(ops.subtract(ops.square(gradient), v), 1 - optimizer.beta_2),
    )
    m_t_hat = ops.divide(m, (1.0 - beta_1_power))
    v_sqrt = ops.add(ops.sqrt(ops.divide(v, (1.0 - beta_2_power))), optimizer.epsilon)
    update = ops.divide(m_t_hat, v_sqrt)
    squares = ops.stack(
        [ops.sum(ops.power(variable, 2)), ops.sum(ops.power(update, 2))]
    )
    return squares, update


def finish(optimizer, gradient, variable, learning_rate, squares, update):
    """Lamb's step on the piece, with `squares` summed over every piece."""
    lr = ops.cast(learning_rate, variable.dtype)
    w_norm = ops.sqrt(squares[0])
    g_norm = ops.sqrt(squares[1])
    ratio = ops.where(
        ops.greater(w_norm, 0),
        ops.where(ops.greater(g_norm, 0), (w_norm / g_norm), 1.0),
        1.0,
    )
    optimizer.assign_sub(variable, ratio * lr * update)
