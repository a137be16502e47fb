"""D4PG on the DeepMind Control Suite, with the learner on keras_replicator.

TF-Replicator's paper (Buchlovsky et al. 2019) validated its design on a D4PG agent
on the DeepMind Control Suite. This module is a small, self-contained D4PG
(Distributed Distributional Deterministic Policy Gradients, Barth-Maron et al. 2018)
whose learner is written with the replica API:

* **Deterministic actor** `pi(o) -> a` in `[-1, 1]^d` (tanh output, rescaled to the
  task's action bounds), trained by following the gradient of the critic's expected
  value, `-mean(E[Z(o, pi(o))])`, as in DDPG.
* **Distributional critic** `Z(o, a)`: a categorical distribution on a fixed
  support of `num_atoms` evenly spaced atoms in `[v_min, v_max]` (the C51
  parametrisation of Bellemare et al. 2017; the paper uses 51 atoms). The target
  distribution `r + gamma^N Z'(o', pi'(o'))` is projected back onto the support
  (`categorical_projection`) and the critic minimises the cross-entropy to it.
* **N-step returns** (the paper uses N = 5): transitions carry the discounted sum of
  N rewards and `gamma^N` times the environment's discounts (`NStepWriter`).
  Control Suite episodes end on a time limit with discount 1, so the learner
  bootstraps through the last step instead of treating it as terminal.
* **Target networks** `pi'`, `Z'`: copied every `target_update_period` learner
  steps (the paper's periodic update), or Polyak-averaged with
  `target_update_rate`.
* **Exploration**: Gaussian noise on the actor's action, `N(0, sigma^2)` with the
  paper's `sigma = 0.3`, clipped to the action bounds.
* **Several actors**: `num_envs` environments stepped in Python in lockstep; a
  copy of the policy acts for all of them in one batched call and is refreshed from
  the learner after every learner phase, as D4PG's actors fetch the learner's
  parameters. Transitions go into a uniform replay buffer (the paper also tries
  prioritised replay; it is left out here).

Where keras_replicator appears: the learner's networks, optimizers and target
networks are created under `strategy.scope()`; `Learner.step_fn` is written for one
replica with per-replica mean losses (Keras optimizers under keras_replicator
strategies average gradients exactly across replicas); each learner phase samples
`num_steps` global batches from replay, feeds them through
`strategy.distribute_input(input_fn)` (each replica gets its share of every global
batch) and runs `strategy.run_steps(step_fn, iterator, num_steps=..., reduce="mean")`.
The sampling happens on the host with a seeded NumPy generator, so a run is
reproducible. The target-network update is a cross-replica write of mirrored
variables, done with `merge_call` from inside the replica step.

The agent learns from the environments' state observations. Pixels (MuJoCo renders
headless with `MUJOCO_GL=egl` where EGL is installed) would need a convolutional
encoder and far more samples than a short CPU run allows. Importing this module
sets `MUJOCO_GL=disable` unless it is already set: no renderer is needed for states,
and it silences GLFW's missing-`DISPLAY` warning on headless machines.

Run: `python examples/d4pg_control.py --domain cartpole --task balance --episodes 24`
(`SMALL_CONFIG` on 2 replicas; about 2-3 minutes on 2 CPU cores).

References:
    Barth-Maron et al. 2018, "Distributed Distributional Deterministic Policy
    Gradients", ICLR. Bellemare et al. 2017, "A Distributional Perspective on
    Reinforcement Learning", ICML. Lillicrap et al. 2016, "Continuous control with
    deep reinforcement learning" (DDPG), ICLR. Tassa et al. 2018, "DeepMind Control
    Suite". Buchlovsky et al. 2019, "TF-Replicator: Distributed Machine Learning for
    Researchers".
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MUJOCO_GL", "disable")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_replicator as kr  # noqa: E402


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
            _check_positive_int(name, getattr(self, name))
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
            _check_positive_int("target_update_period", self.target_update_period)
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


def _check_positive_int(name, value):
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


# ----------------------------------------------------------------------------------
# Distributional critic: the categorical projection.


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


# ----------------------------------------------------------------------------------
# Networks.


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
    _check_positive_int("observation_size", observation_size)
    _check_positive_int("action_size", action_size)
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
    _check_positive_int("observation_size", observation_size)
    _check_positive_int("action_size", action_size)
    _check_positive_int("num_atoms", num_atoms)
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


# ----------------------------------------------------------------------------------
# Experience: environments, N-step transitions, replay.


def flatten_observation(observation) -> np.ndarray:
    """Concatenates a Control Suite observation dict into one float32 vector."""
    return np.concatenate(
        [np.asarray(v, dtype=np.float32).reshape(-1) for v in observation.values()]
    )


class ControlSuiteEnv:
    """A Control Suite task with flat observations, `[-1, 1]` actions, action repeat.

    Args:
        domain: Control Suite domain, e.g. `"cartpole"`.
        task: Task of the domain, e.g. `"balance"`.
        seed: Seed of the task's random initial states. Defaults to `0`.
        action_repeat: Physics-control steps per agent action; rewards are
            summed and discounts multiplied over them. Defaults to `1`.

    Raises:
        ValueError: If the domain/task pair is not in the Control Suite.
    """

    def __init__(self, domain: str, task: str, seed: int = 0, action_repeat: int = 1):
        from dm_control import suite

        if (domain, task) not in suite.ALL_TASKS:
            raise ValueError(
                "`domain` and `task` must name a Control Suite task. Received: "
                f"domain={domain!r}, task={task!r}. Some valid pairs: "
                f"{sorted(suite.BENCHMARKING)[:6]}..."
            )
        _check_positive_int("action_repeat", action_repeat)
        self._env = suite.load(domain, task, task_kwargs={"random": seed})
        self.action_repeat = action_repeat
        spec = self._env.action_spec()
        self._low = spec.minimum.astype(np.float64)
        self._high = spec.maximum.astype(np.float64)
        self.action_size = int(np.prod(spec.shape))
        self.observation_size = int(
            sum(int(np.prod(s.shape)) for s in self._env.observation_spec().values())
        )

    def reset(self):
        """Starts an episode; returns the first observation."""
        return flatten_observation(self._env.reset().observation)

    def step(self, action):
        """Applies `action` (in `[-1, 1]`) `action_repeat` times.

        Returns:
            `(observation, reward, discount, last)`.
        """
        scaled = self._low + (np.asarray(action, np.float64) + 1.0) * 0.5 * (
            self._high - self._low
        )
        reward, discount = 0.0, 1.0
        for _ in range(self.action_repeat):
            timestep = self._env.step(scaled)
            reward += discount * (timestep.reward or 0.0)
            discount *= timestep.discount
            if timestep.last():
                break
        observation = flatten_observation(timestep.observation)
        return observation, reward, discount, timestep.last()


class ReplayBuffer:
    """A fixed-size ring buffer of N-step transitions, sampled uniformly.

    Args:
        capacity: Transitions kept; the oldest are overwritten.
        observation_size: Length of the flat observation vector.
        action_size: Number of action dimensions.
        seed: Seed of the sampling generator. Defaults to `0`.
    """

    def __init__(self, capacity, observation_size, action_size, seed=0):
        _check_positive_int("capacity", capacity)
        self.capacity = capacity
        self._observation = np.zeros((capacity, observation_size), np.float32)
        self._action = np.zeros((capacity, action_size), np.float32)
        self._reward = np.zeros((capacity,), np.float32)
        self._discount = np.zeros((capacity,), np.float32)
        self._next_observation = np.zeros((capacity, observation_size), np.float32)
        self._next = 0
        self.size = 0
        self._rng = np.random.default_rng(seed)

    def add(self, observation, action, reward, discount, next_observation):
        """Stores one transition."""
        i = self._next
        self._observation[i] = observation
        self._action[i] = action
        self._reward[i] = reward
        self._discount[i] = discount
        self._next_observation[i] = next_observation
        self._next = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, count):
        """`count` transitions drawn uniformly with replacement.

        Returns:
            A tuple `(observation, action, reward, discount, next_observation)` of
            arrays with leading dimension `count`.

        Raises:
            ValueError: If the buffer is empty.
        """
        if self.size == 0:
            raise ValueError(
                "Cannot sample from an empty replay buffer. Received: size=0. "
                "Add transitions first."
            )
        index = self._rng.integers(0, self.size, size=count)
        return (
            self._observation[index],
            self._action[index],
            self._reward[index],
            self._discount[index],
            self._next_observation[index],
        )


class NStepWriter:
    """Turns one actor's steps into N-step transitions for the replay buffer.

    A transition starting at step `t` holds `o_t`, `a_t`, the return
    `sum_k gamma^k r_{t+k}` over up to `n` steps, the bootstrap discount `gamma^n`
    times the environment's discounts, and `o_{t+n}`. At the end of an episode the
    last `n - 1` steps are written with shorter horizons.

    Args:
        replay: The `ReplayBuffer` to write to.
        n: Number of steps `N`.
        discount: Per-step discount `gamma`.
    """

    def __init__(self, replay, n, discount):
        self._replay = replay
        self._n = n
        self._discount = discount
        self._steps = collections.deque()

    def append(self, observation, action, reward, discount, next_observation, last):
        """Records `o_t, a_t` and what followed; writes any complete transitions."""
        self._steps.append((observation, action, reward, discount))
        if len(self._steps) == self._n:
            self._write(next_observation)
        if last:
            while self._steps:
                self._write(next_observation)

    def _write(self, next_observation):
        total, bootstrap = 0.0, 1.0
        for _, _, reward, discount in self._steps:
            total += bootstrap * reward
            bootstrap *= self._discount * discount
        observation, action, _, _ = self._steps.popleft()
        self._replay.add(observation, action, total, bootstrap, next_observation)


# ----------------------------------------------------------------------------------
# The learner: the replica API.


class Learner:
    """The D4PG learner: networks, target networks, optimizers and the replica step.

    Everything is created under `strategy.scope()`. `step_fn` is written for one
    replica; `update` runs it on every replica with `strategy.run_steps`.

    Args:
        observation_size: Length of the flat observation vector.
        action_size: Number of action dimensions.
        config: A `D4PGConfig`. Defaults to `None` (`D4PGConfig()`).
        strategy: A keras_replicator strategy (e.g. `kr.auto()`). Defaults to
            `None`: one device, without distribution (the reference the
            distributed learner must match).

    Raises:
        TypeError: If `config` is not a `D4PGConfig` or `strategy` lacks the
            replica API.
        ValueError: If `config.batch_size` is not divisible by the replicas.
    """

    def __init__(
        self,
        observation_size: int,
        action_size: int,
        config: D4PGConfig | None = None,
        strategy=None,
    ):
        config = D4PGConfig() if config is None else config
        if not isinstance(config, D4PGConfig):
            raise TypeError(
                "`config` must be a `D4PGConfig`. "
                f"Received: config={config!r} of type {type(config).__name__}."
            )
        if strategy is not None and not hasattr(strategy, "run_steps"):
            raise TypeError(
                "`strategy` must be a keras_replicator strategy (with "
                "`distribute_input` and `run_steps`), or None for one device. "
                f"Received: strategy={strategy!r}. Use `kr.auto()`."
            )
        replicas = 1 if strategy is None else strategy.num_replicas_in_sync
        if config.batch_size % replicas:
            raise ValueError(
                f"`batch_size` must be divisible by the {replicas} replicas. "
                f"Received: batch_size={config.batch_size}. Use a multiple of "
                f"{replicas}."
            )
        self.config = config
        self.strategy = strategy
        self.observation_size = observation_size
        self.action_size = action_size
        scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
        with scope:
            hidden = config.hidden_units
            self.actor = build_actor(observation_size, action_size, hidden)
            self.critic = build_critic(
                observation_size, action_size, config.num_atoms, hidden
            )
            self.target_actor = build_actor(
                observation_size, action_size, hidden, name="target_actor"
            )
            self.target_critic = build_critic(
                observation_size, action_size, config.num_atoms, hidden, "target_critic"
            )
            self.target_actor.set_weights(self.actor.get_weights())
            self.target_critic.set_weights(self.critic.get_weights())
            self.actor_optimizer = kr.wrap_optimizer(
                keras.optimizers.Adam(config.actor_learning_rate)
            )
            self.critic_optimizer = kr.wrap_optimizer(
                keras.optimizers.Adam(config.critic_learning_rate)
            )
            # Every variable must exist before the compiled loop: TF cannot create
            # variables inside a replicated while loop.
            self.actor_optimizer.build(self.actor.trainable_variables)
            self.critic_optimizer.build(self.critic.trainable_variables)
        self.support = np.linspace(
            config.v_min, config.support_max, config.num_atoms, dtype=np.float32
        )
        # One bound method object, so run_steps compiles its loop once.
        self._replica_step = self.step_fn
        self._one_device_step = None

    def step_fn(self, batch):
        """One D4PG update, written for one replica.

        Args:
            batch: `(observation, action, reward, discount, next_observation)`,
                this replica's share of the global batch.

        Returns:
            `(critic_loss, actor_loss, mean_q)`, means over this replica's batch.
        """
        observation, action, reward, discount, next_observation = batch
        support = tf.constant(self.support)
        next_action = self.target_actor(next_observation)
        next_probabilities = tf.nn.softmax(
            self.target_critic([next_observation, next_action])
        )
        target = tf.stop_gradient(
            categorical_projection(support, next_probabilities, reward, discount)
        )
        with tf.GradientTape() as tape:
            logits = self.critic([observation, action], training=True)
            critic_loss = tf.reduce_mean(
                tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=logits)
            )
        critic_gradients = tape.gradient(critic_loss, self.critic.trainable_variables)
        with tf.GradientTape() as tape:
            policy_logits = self.critic(
                [observation, self.actor(observation, training=True)]
            )
            q = tf.reduce_sum(tf.nn.softmax(policy_logits) * support, axis=-1)
            actor_loss = -tf.reduce_mean(q)
        actor_gradients = tape.gradient(actor_loss, self.actor.trainable_variables)
        # Both gradients come from the same (pre-update) critic, as in the paper's
        # Algorithm 1; then both networks step.
        self.critic_optimizer.apply_gradients(
            zip(critic_gradients, self.critic.trainable_variables)
        )
        self.actor_optimizer.apply_gradients(
            zip(actor_gradients, self.actor.trainable_variables)
        )
        self._update_targets()
        return critic_loss, actor_loss, -actor_loss

    def _update_targets(self):
        config = self.config
        if config.target_update_rate is not None:
            mix = tf.constant(config.target_update_rate, tf.float32)
        else:
            iterations = self.critic_optimizer.iterations  # already incremented
            mix = tf.cast(
                tf.equal(iterations % config.target_update_period, 0), tf.float32
            )
        pairs = list(zip(self.target_actor.weights, self.actor.weights)) + list(
            zip(self.target_critic.weights, self.critic.weights)
        )

        # Target variables are mirrored: every replica holds the same value, so
        # they are written once, in cross-replica context, from each device's copy
        # of the online weights (the same on every replica).
        def update(strategy, mix):
            for target, online in pairs:
                strategy.extended.update(
                    target.value,
                    lambda t, o, m: t.assign(t + m * (o - t)),
                    args=(online.value, mix),
                    group=False,
                )

        tf.distribute.get_replica_context().merge_call(update, args=(mix,))

    def update(self, batches, num_steps: int) -> tuple[float, float, float]:
        """Runs `num_steps` learner steps on `num_steps` consecutive global batches.

        Args:
            batches: `(observation, action, reward, discount, next_observation)`
                arrays with leading dimension `num_steps * config.batch_size`, as
                returned by `ReplayBuffer.sample`.
            num_steps: Learner steps to run (one compiled call).

        Returns:
            The last step's `(critic_loss, actor_loss, mean_q)` as floats, averaged
            over the replicas.

        Raises:
            ValueError: If the arrays do not hold `num_steps` global batches.
        """
        _check_positive_int("num_steps", num_steps)
        global_batch = self.config.batch_size
        rows = {len(a) for a in batches}
        if rows != {num_steps * global_batch}:
            raise ValueError(
                "`batches` must hold `num_steps * batch_size` = "
                f"{num_steps * global_batch} rows in every array. Received: "
                f"rows={sorted(rows)}, num_steps={num_steps}. Sample "
                "`replay.sample(num_steps * config.batch_size)`."
            )
        batches = tuple(np.asarray(a, np.float32) for a in batches)
        if self.strategy is None:
            return self._update_one_device(batches, num_steps)

        def input_fn(context):
            # One worker reads its share of every global batch; each replica then
            # gets `per_replica` consecutive rows of it.
            per_replica = context.get_per_replica_batch_size(global_batch)
            dataset = tf.data.Dataset.from_tensor_slices(batches)
            dataset = dataset.shard(
                context.num_input_pipelines, context.input_pipeline_id
            )
            return dataset.batch(per_replica, drop_remainder=True)

        iterator = iter(self.strategy.distribute_input(input_fn))
        outputs = self.strategy.run_steps(
            self._replica_step, iterator, num_steps=num_steps, reduce="mean"
        )
        return tuple(float(v) for v in outputs)

    def _update_one_device(self, batches, num_steps):
        if self._one_device_step is None:
            self._one_device_step = tf.function(self.step_fn)
        size = self.config.batch_size
        for step in range(num_steps):
            batch = tuple(a[step * size : (step + 1) * size] for a in batches)
            outputs = self._one_device_step(batch)
        return tuple(float(v) for v in outputs)

    def weights(self):
        """All network weights (online and target), as NumPy arrays."""
        return [
            w
            for model in (
                self.actor,
                self.critic,
                self.target_actor,
                self.target_critic,
            )
            for w in model.get_weights()
        ]


# ----------------------------------------------------------------------------------
# Acting and the training loop.


class Actors:
    """`num_envs` environments stepped in lockstep by one copy of the policy.

    The policy copy lives on the host, outside the strategy, and is refreshed from
    the learner with `sync`, as D4PG's actors fetch the learner's parameters.

    Args:
        domain: Control Suite domain.
        task: Control Suite task.
        learner: The `Learner` whose actor weights are copied.
        num_envs: Number of environments. Defaults to `2`.
        seed: Seed of the environments and the exploration noise. Defaults to `0`.
    """

    def __init__(self, domain, task, learner, num_envs=2, seed=0):
        _check_positive_int("num_envs", num_envs)
        config = learner.config
        self.envs = [
            ControlSuiteEnv(domain, task, seed * 1000 + i, config.action_repeat)
            for i in range(num_envs)
        ]
        self._learner = learner
        self._sigma = config.sigma
        self._rng = np.random.default_rng(seed + 12345)
        self.policy = build_actor(
            learner.observation_size,
            learner.action_size,
            config.hidden_units,
            name="policy",
        )
        self._act = tf.function(
            lambda o: self.policy(o, training=False),
            input_signature=[
                tf.TensorSpec([None, learner.observation_size], tf.float32)
            ],
        )
        self.sync()

    def sync(self):
        """Copies the learner's actor weights into the acting policy."""
        self.policy.set_weights(self._learner.actor.get_weights())

    def act(self, observations, explore=True):
        """Actions for a batch of observations, with Gaussian noise if `explore`."""
        actions = self._act(np.asarray(observations, np.float32)).numpy()
        if explore and self._sigma > 0:
            actions = actions + self._sigma * self._rng.normal(size=actions.shape)
        return np.clip(actions, -1.0, 1.0).astype(np.float32)


@dataclasses.dataclass
class TrainingRun:
    """What `train` returns.

    Attributes:
        episode_returns: Undiscounted return of every finished training episode
            (with exploration noise), in the order they finished; the actors'
            episodes of one round are listed by actor index.
        learner: The trained `Learner`.
        learner_steps: Learner updates run.
        env_steps: Agent steps taken, summed over the actors.
        seconds: Wall-clock time of the run.
        losses: `(critic_loss, actor_loss, mean_q)` after every learner phase.
    """

    episode_returns: list[float]
    learner: Learner
    learner_steps: int
    env_steps: int
    seconds: float
    losses: list[tuple[float, float, float]]


def train(
    domain: str = "cartpole",
    task: str = "balance",
    *,
    episodes: int = 24,
    num_envs: int = 2,
    config: D4PGConfig | None = None,
    strategy=None,
    seed: int = 0,
    verbose: bool = True,
) -> TrainingRun:
    """Trains D4PG on a Control Suite task and returns the episode returns.

    The actors run rounds of `num_envs` episodes in lockstep. Whenever they have
    collected `config.env_steps_per_phase` transitions (and the replay holds
    `config.min_replay_size`), the learner samples `config.updates_per_phase`
    global batches and runs them in one `strategy.run_steps` call; then the actors
    copy the new policy.

    Args:
        domain: Control Suite domain. Defaults to `"cartpole"`.
        task: Control Suite task. Defaults to `"balance"`.
        episodes: Training episodes in total, a multiple of `num_envs`. Defaults
            to `24`.
        num_envs: Environments stepped together (the actors). Defaults to `2`.
        config: A `D4PGConfig`. Defaults to `None` (`D4PGConfig()`).
        strategy: A keras_replicator strategy for the learner (e.g.
            `kr.auto(num_replicas=2)`). Defaults to `None` (one device).
        seed: Seed of the weights, environments, noise and replay sampling.
            Defaults to `0`.
        verbose: Print the returns of every round. Defaults to `True`.

    Returns:
        A `TrainingRun`; `run.episode_returns` lists the return of every episode.

    Raises:
        ValueError: If `episodes` is not a positive multiple of `num_envs`.
    """
    config = D4PGConfig() if config is None else config
    _check_positive_int("episodes", episodes)
    _check_positive_int("num_envs", num_envs)
    if episodes % num_envs:
        lower = max(num_envs, episodes - episodes % num_envs)
        raise ValueError(
            f"`episodes` must be a multiple of `num_envs`={num_envs} (the actors run "
            f"their episodes in lockstep). Received: episodes={episodes}. Use "
            f"{lower} or {lower + num_envs}."
        )
    start = time.perf_counter()
    keras.utils.set_random_seed(seed)
    probe = ControlSuiteEnv(domain, task, seed, config.action_repeat)
    learner = Learner(probe.observation_size, probe.action_size, config, strategy)
    actors = Actors(domain, task, learner, num_envs, seed)
    replay = ReplayBuffer(
        config.replay_capacity, probe.observation_size, probe.action_size, seed
    )
    writers = [NStepWriter(replay, config.n_step, config.discount) for _ in actors.envs]
    returns, losses = [], []
    learner_steps = env_steps = since_phase = 0
    for round_index in range(episodes // num_envs):
        observations = [env.reset() for env in actors.envs]
        totals = np.zeros(num_envs)
        done = False
        while not done:
            actions = actors.act(np.stack(observations))
            for i, env in enumerate(actors.envs):
                next_observation, reward, discount, last = env.step(actions[i])
                writers[i].append(
                    observations[i],
                    actions[i],
                    reward,
                    discount,
                    next_observation,
                    last,
                )
                observations[i] = next_observation
                totals[i] += reward
                # Control Suite episodes have a fixed length: the actors finish
                # together.
                done = done or last
            env_steps += num_envs
            since_phase += num_envs
            if (
                since_phase >= config.env_steps_per_phase
                and replay.size >= config.min_replay_size
            ):
                since_phase = 0
                steps = config.updates_per_phase
                losses.append(
                    learner.update(replay.sample(steps * config.batch_size), steps)
                )
                learner_steps += steps
                actors.sync()
        returns.extend(float(t) for t in totals)
        if verbose:
            loss_text = (
                f", critic loss {losses[-1][0]:.3f}, mean Q {losses[-1][2]:.1f}"
                if losses
                else ""
            )
            print(
                f"round {round_index + 1:3d}: episodes {len(returns):4d}, returns "
                f"{np.array2string(totals, precision=1)}, learner steps "
                f"{learner_steps}{loss_text}, {time.perf_counter() - start:.0f} s",
                flush=True,
            )
    return TrainingRun(
        returns, learner, learner_steps, env_steps, time.perf_counter() - start, losses
    )


def evaluate(
    domain: str, task: str, learner: Learner, episodes: int = 2, seed: int = 100
) -> list[float]:
    """Returns of the learner's actor without exploration noise.

    Args:
        domain: Control Suite domain.
        task: Control Suite task.
        learner: A trained `Learner`.
        episodes: Episodes to run (one environment each). Defaults to `2`.
        seed: Seed of the environments' initial states (`train` seeds its actors
            with `1000 * seed + i`). Defaults to `100`.

    Returns:
        A list of `episodes` returns.
    """
    _check_positive_int("episodes", episodes)
    actors = Actors(domain, task, learner, episodes, seed)
    observations = [env.reset() for env in actors.envs]
    totals = np.zeros(episodes)
    done = False
    while not done:
        actions = actors.act(np.stack(observations), explore=False)
        for i, env in enumerate(actors.envs):
            observations[i], reward, _, last = env.step(actions[i])
            totals[i] += reward
            done = done or last
    return [float(t) for t in totals]


def main(argv: list[str] | None = None) -> None:
    """Command line: trains D4PG and prints the first and last returns."""
    parser = argparse.ArgumentParser(
        description="D4PG on the DeepMind Control Suite, learner on keras_replicator."
    )
    parser.add_argument("--domain", default="cartpole")
    parser.add_argument("--task", default="balance")
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument(
        "--preset",
        choices=["small", "paper"],
        default="small",
        help="`small`: SMALL_CONFIG (minutes on a CPU); `paper`: D4PGConfig().",
    )
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--action-repeat", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tf.get_logger().setLevel("ERROR")  # MirroredStrategy's INFO lines
    strategy = kr.auto(num_replicas=args.replicas)
    config = SMALL_CONFIG if args.preset == "small" else D4PGConfig()
    overrides = {"batch_size": args.batch_size, "action_repeat": args.action_repeat}
    config = dataclasses.replace(
        config, **{k: v for k, v in overrides.items() if v is not None}
    )
    run = train(
        args.domain,
        args.task,
        episodes=args.episodes,
        num_envs=args.num_envs,
        config=config,
        strategy=strategy,
        seed=args.seed,
    )
    k = max(args.num_envs, len(run.episode_returns) // 6)
    first = np.mean(run.episode_returns[:k])
    last = np.mean(run.episode_returns[-k:])
    print(
        f"mean return of the first {k} episodes {first:.1f}, of the last {k} "
        f"{last:.1f}; {run.learner_steps} learner steps in {run.seconds:.0f} s"
    )


if __name__ == "__main__":
    main()
