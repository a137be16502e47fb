"""Hyperparameters of the agent (`D4PGConfig`) and the CPU preset `SMALL_CONFIG`."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class D4PGConfig:
    """Hyperparameters of the agent, validated on construction.

    The defaults are the paper's values where it gives one (51 atoms, N = 5,
    batch 256, Adam 1e-4, sigma 0.3, target copies every 100 steps, a replay of
    10^6); `SMALL_CONFIG` trades some of them for a run of minutes on a CPU.

    Args:
        num_atoms: Atoms of the categorical value distribution. Defaults to `51`.
        v_min: Lowest atom. Defaults to `0.0` (Control Suite rewards are in
            `[0, 1]`).
        v_max: Highest atom. Defaults to `None`: the largest discounted return,
            `action_repeat / (1 - discount)`.
        discount: Per-step discount `gamma`. Defaults to `0.99`.
        n_step: Length `N` of the N-step returns. Defaults to `5`.
        batch_size: Global batch of the learner, split over the replicas.
            Defaults to `256` (as in the paper).
        actor_learning_rate: Adam learning rate of the actor. Defaults to `1e-4`
            (as in the paper).
        critic_learning_rate: Adam learning rate of the critic. Defaults to `1e-4`
            (as in the paper).
        sigma: Standard deviation of the Gaussian exploration noise. Defaults to
            `0.3` (as in the paper).
        target_update_period: Copy the online networks to the targets every this
            many learner steps. Defaults to `100` (as in the paper). Pass `None`
            to use `target_update_rate`.
        target_update_rate: Polyak rate `tau` of a soft target update after every
            learner step, used when `target_update_period` is `None`. Defaults to
            `None`.
        hidden_units: Widths of the hidden layers of both networks. Defaults to
            `(256, 256)`.
        replay_capacity: Transitions kept in the replay buffer. Defaults to
            `1_000_000` (as in the paper).
        min_replay_size: Transitions collected before learning starts. Defaults
            to `1000`.
        env_steps_per_phase: Transitions (summed over the actors) collected
            between two learner phases. Defaults to `100`.
        updates_per_phase: Learner steps per phase, run in one
            `strategy.run_steps` call. Defaults to `50`.
        action_repeat: Environment steps per agent action (the agent sees the
            summed reward). Defaults to `1`.

    Raises:
        TypeError: If a count (`batch_size`, `n_step`, ...) is not an integer.
        ValueError: If a value is out of range or the support is empty.

    Example:
    >>> config = D4PGConfig(batch_size=128, action_repeat=4)
    >>> round(config.support_max, 1)
    400.0
    """

    num_atoms: int = 51
    v_min: float = 0.0
    v_max: float | None = None
    discount: float = 0.99
    n_step: int = 5
    batch_size: int = 256
    actor_learning_rate: float = 1e-4
    critic_learning_rate: float = 1e-4
    sigma: float = 0.3
    target_update_period: int | None = 100
    target_update_rate: float | None = None
    hidden_units: tuple[int, ...] = (256, 256)
    replay_capacity: int = 1_000_000
    min_replay_size: int = 1000
    env_steps_per_phase: int = 100
    updates_per_phase: int = 50
    action_repeat: int = 1

    def __post_init__(self):
        if isinstance(self.hidden_units, list):
            object.__setattr__(self, "hidden_units", tuple(self.hidden_units))
        for name in (
            "num_atoms",
            "n_step",
            "batch_size",
            "replay_capacity",
            "min_replay_size",
            "env_steps_per_phase",
            "updates_per_phase",
            "action_repeat",
        ):
            check_positive_int(name, getattr(self, name))
        if self.num_atoms < 2:
            raise ValueError(
                "`num_atoms` must be at least 2 to span a support. "
                f"Received: num_atoms={self.num_atoms}."
            )
        if not 0.0 < self.discount <= 1.0:
            raise ValueError(
                f"`discount` must be in (0, 1]. Received: discount={self.discount!r}."
            )
        if self.discount == 1.0 and self.v_max is None:
            raise ValueError(
                "`v_max` cannot be derived from `discount=1.0`. "
                f"Received: discount={self.discount!r}, v_max=None. "
                "Pass `v_max` explicitly."
            )
        if self.support_max <= self.v_min:
            raise ValueError(
                "`v_max` must be larger than `v_min`. "
                f"Received: v_min={self.v_min!r}, v_max={self.v_max!r}."
            )
        for name in ("actor_learning_rate", "critic_learning_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"`{name}` must be positive. "
                    f"Received: {name}={getattr(self, name)!r}."
                )
        if not self.sigma >= 0:
            raise ValueError(
                f"`sigma` must be non-negative. Received: sigma={self.sigma!r}."
            )
        if (self.target_update_period is None) == (self.target_update_rate is None):
            raise ValueError(
                "Pass exactly one of `target_update_period` (periodic copies) and "
                "`target_update_rate` (Polyak averaging). Received: "
                f"target_update_period={self.target_update_period!r}, "
                f"target_update_rate={self.target_update_rate!r}."
            )
        if self.target_update_period is not None:
            check_positive_int("target_update_period", self.target_update_period)
        if self.target_update_rate is not None and not (
            0.0 < self.target_update_rate <= 1.0
        ):
            raise ValueError(
                "`target_update_rate` must be in (0, 1]. "
                f"Received: target_update_rate={self.target_update_rate!r}."
            )
        if not self.hidden_units or not all(
            isinstance(u, int) and not isinstance(u, bool) and u > 0
            for u in self.hidden_units
        ):
            raise ValueError(
                "`hidden_units` must be a non-empty tuple of positive integers. "
                f"Received: hidden_units={self.hidden_units!r}."
            )
        if self.min_replay_size > self.replay_capacity:
            raise ValueError(
                "`min_replay_size` must not exceed `replay_capacity`. Received: "
                f"min_replay_size={self.min_replay_size}, "
                f"replay_capacity={self.replay_capacity}."
            )

    @property
    def support_max(self) -> float:
        """`v_max`, or the largest discounted return when `v_max` is `None`."""
        if self.v_max is not None:
            return float(self.v_max)
        return self.action_repeat / (1.0 - self.discount)


def check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"`{name}` must be a positive integer. "
            f"Received: {name}={value!r} of type {type(value).__name__}."
        )
    if value < 1:
        raise ValueError(
            f"`{name}` must be a positive integer. Received: {name}={value!r}."
        )


#: Settings for a run of a few minutes on 2 CPU cores (the notebook's CPU settings):
#: small networks, Adam 1e-3, batch 128, Polyak-averaged targets and an action
#: repeat of 4. On cartpole balance they reach returns above 900 in about 24
#: episodes.
SMALL_CONFIG = D4PGConfig(
    batch_size=128,
    hidden_units=(64, 64),
    actor_learning_rate=1e-3,
    critic_learning_rate=1e-3,
    target_update_period=None,
    target_update_rate=0.005,
    action_repeat=4,
    min_replay_size=500,
    env_steps_per_phase=50,
    updates_per_phase=50,
)
