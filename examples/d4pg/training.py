"""The training loop (`train`) and a noise-free evaluation (`evaluate`)."""

from __future__ import annotations

import dataclasses
import time

import keras
import numpy as np

from d4pg.actors import Actors
from d4pg.config import D4PGConfig, check_positive_int
from d4pg.environment import ControlSuiteEnv
from d4pg.learner import Learner
from d4pg.replay import NStepWriter, ReplayBuffer


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
    check_positive_int("episodes", episodes)
    check_positive_int("num_envs", num_envs)
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
    check_positive_int("episodes", episodes)
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
