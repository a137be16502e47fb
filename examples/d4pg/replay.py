"""Experience: N-step transitions and the uniform replay buffer."""

from __future__ import annotations

import collections

import numpy as np

from d4pg.config import check_positive_int


class ReplayBuffer:
    """A fixed-size ring buffer of N-step transitions, sampled uniformly.

    Args:
        capacity: Transitions kept; the oldest are overwritten.
        observation_size: Length of the flat observation vector.
        action_size: Number of action dimensions.
        seed: Seed of the sampling generator. Defaults to `0`.
    """

    def __init__(self, capacity, observation_size, action_size, seed=0):
        check_positive_int("capacity", capacity)
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
