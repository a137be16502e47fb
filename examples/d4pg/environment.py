"""A Control Suite task with flat observations and `[-1, 1]` actions."""

from __future__ import annotations

import numpy as np

from d4pg.config import check_positive_int


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
        check_positive_int("action_repeat", action_repeat)
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
