"""Acting: environments stepped in lockstep by a host copy of the policy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from d4pg.config import check_positive_int
from d4pg.environment import ControlSuiteEnv
from d4pg.networks import build_actor


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
        check_positive_int("num_envs", num_envs)
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
