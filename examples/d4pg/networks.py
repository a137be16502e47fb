"""The deterministic actor and the distributional critic networks."""

from __future__ import annotations

import keras

from d4pg.config import check_positive_int


def build_actor(
    observation_size: int,
    action_size: int,
    hidden_units: tuple[int, ...] = (256, 256),
    name: str = "actor",
) -> keras.Model:
    """The deterministic policy: observation -> action in `[-1, 1]^action_size`.

    The first layer is layer-normalised and squashed with tanh, so unscaled state
    features (positions, velocities) reach the rest of the network in a fixed
    range; the last layer starts small so the initial policy is near the centre
    of the action space (Lillicrap et al. 2016).

    Args:
        observation_size: Length of the flat observation vector.
        action_size: Number of action dimensions.
        hidden_units: Widths of the hidden layers. Defaults to `(256, 256)`.
        name: Model name. Defaults to `"actor"`.

    Returns:
        A `keras.Model`.
    """
    check_positive_int("observation_size", observation_size)
    check_positive_int("action_size", action_size)
    observation = keras.Input((observation_size,), name="observation")
    h = _torso(observation, hidden_units)
    action = keras.layers.Dense(
        action_size,
        activation="tanh",
        kernel_initializer=keras.initializers.RandomUniform(-3e-3, 3e-3),
        name="action",
    )(h)
    return keras.Model(observation, action, name=name)


def build_critic(
    observation_size: int,
    action_size: int,
    num_atoms: int = 51,
    hidden_units: tuple[int, ...] = (256, 256),
    name: str = "critic",
) -> keras.Model:
    """The distributional critic: (observation, action) -> logits over the atoms.

    Args:
        observation_size: Length of the flat observation vector.
        action_size: Number of action dimensions.
        num_atoms: Atoms of the value distribution. Defaults to `51`.
        hidden_units: Widths of the hidden layers. Defaults to `(256, 256)`.
        name: Model name. Defaults to `"critic"`.

    Returns:
        A `keras.Model` taking `[observation, action]`.
    """
    check_positive_int("observation_size", observation_size)
    check_positive_int("action_size", action_size)
    check_positive_int("num_atoms", num_atoms)
    observation = keras.Input((observation_size,), name="observation")
    action = keras.Input((action_size,), name="action")
    h = keras.layers.Concatenate()([observation, action])
    h = _torso(h, hidden_units)
    logits = keras.layers.Dense(
        num_atoms,
        kernel_initializer=keras.initializers.RandomUniform(-3e-3, 3e-3),
        name="logits",
    )(h)
    return keras.Model([observation, action], logits, name=name)


def _torso(x, hidden_units):
    h = keras.layers.Dense(hidden_units[0])(x)
    h = keras.layers.LayerNormalization()(h)
    h = keras.layers.Activation("tanh")(h)
    for units in hidden_units[1:]:
        h = keras.layers.Dense(units, activation="elu")(h)
    return h
