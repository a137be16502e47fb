"""The D4PG example: categorical projection, N-step returns, transparent learner."""

import importlib
import pathlib
import sys

import numpy as np
import pytest

import keras_replicator as kr

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"


@pytest.fixture(scope="module")
def d4pg():
    # The agent is the `d4pg` package in examples/ (as the notebook imports it).
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module("d4pg")
    finally:
        sys.path.remove(str(EXAMPLES))
        for name in [n for n in sys.modules if n == "d4pg" or n.startswith("d4pg.")]:
            del sys.modules[name]


def _project(d4pg, support, probabilities, rewards, discounts):
    return d4pg.categorical_projection(
        np.asarray(support, np.float32),
        np.asarray(probabilities, np.float32),
        np.asarray(rewards, np.float32),
        np.asarray(discounts, np.float32),
    ).numpy()


def _reference_projection(support, probabilities, rewards, discounts):
    """Algorithm 1 of Bellemare et al. 2017, one atom at a time."""
    v_min, v_max = support[0], support[-1]
    spacing = (v_max - v_min) / (len(support) - 1)
    projected = np.zeros_like(probabilities, dtype=np.float64)
    for b in range(len(probabilities)):
        for j, z in enumerate(support):
            moved = min(max(rewards[b] + discounts[b] * z, v_min), v_max)
            position = (moved - v_min) / spacing
            lower, upper = int(np.floor(position)), int(np.ceil(position))
            p = probabilities[b, j]
            if lower == upper:
                projected[b, lower] += p
            else:
                projected[b, lower] += p * (upper - position)
                projected[b, upper] += p * (position - lower)
    return projected


def test_projection_hand_computed(d4pg):
    # Atoms 0, 1, 2 move to 0.5, 1.0, 1.5: 0.2 splits 0.1/0.1 over atoms 0 and 1,
    # 0.5 stays on atom 1, 0.3 splits 0.15/0.15 over atoms 1 and 2.
    projected = _project(d4pg, [0, 1, 2], [[0.2, 0.5, 0.3]], [0.5], [0.5])
    np.testing.assert_allclose(projected, [[0.1, 0.75, 0.15]], atol=1e-6)


def test_projection_clips_at_the_support_edges(d4pg):
    probabilities = [[0.2, 0.5, 0.3]] * 3
    projected = _project(
        d4pg, [0, 1, 2], probabilities, [10.0, -10.0, 1.3], [1.0, 1.0, 0.0]
    )
    np.testing.assert_allclose(projected[0], [0, 0, 1], atol=1e-6)  # above v_max
    np.testing.assert_allclose(projected[1], [1, 0, 0], atol=1e-6)  # below v_min
    # Terminal (discount 0): every atom lands on 1.3.
    np.testing.assert_allclose(projected[2], [0, 0.7, 0.3], atol=1e-6)


def test_projection_matches_reference_and_conserves_mass(d4pg):
    rng = np.random.default_rng(0)
    support = np.linspace(-3.0, 7.0, 11)
    probabilities = rng.dirichlet(np.ones(11), size=64)
    rewards = rng.uniform(-6.0, 10.0, size=64)  # some land outside the support
    discounts = rng.choice([0.0, 0.5, 0.9, 0.99, 1.0], size=64)
    projected = _project(d4pg, support, probabilities, rewards, discounts)
    expected = _reference_projection(support, probabilities, rewards, discounts)
    np.testing.assert_allclose(projected, expected, atol=1e-5)
    np.testing.assert_allclose(projected.sum(axis=1), 1.0, atol=1e-5)
    assert projected.min() >= 0.0


def test_projection_rejects_mismatched_shapes(d4pg):
    with pytest.raises(ValueError, match="rewards"):
        _project(d4pg, [0, 1, 2], [[0.2, 0.5, 0.3]], [0.5, 0.5], [0.5])


def test_n_step_transitions(d4pg):
    replay = d4pg.ReplayBuffer(10, observation_size=1, action_size=1)
    writer = d4pg.NStepWriter(replay, n=2, discount=0.5)
    observations = np.arange(4, dtype=np.float32)[:, None]
    for t, reward in enumerate([1.0, 2.0, 3.0]):
        writer.append(
            observations[t], [0.0], reward, 1.0, observations[t + 1], last=t == 2
        )
    assert replay.size == 3
    # (o_t, sum of up to 2 discounted rewards, bootstrap discount, o_{t+n}); the
    # episode ends on a time limit (discount 1), so the last one still bootstraps.
    np.testing.assert_allclose(replay._reward[:3], [1 + 0.5 * 2, 2 + 0.5 * 3, 3])
    np.testing.assert_allclose(replay._discount[:3], [0.25, 0.25, 0.5])
    np.testing.assert_allclose(replay._observation[:3, 0], [0, 1, 2])
    np.testing.assert_allclose(replay._next_observation[:3, 0], [2, 3, 3])


def _batch(rows, rng):
    return (
        rng.normal(size=(rows, 5)).astype("float32"),
        rng.uniform(-1, 1, size=(rows, 1)).astype("float32"),
        rng.uniform(0, 3, size=rows).astype("float32"),
        rng.choice([0.0, 0.95], size=rows).astype("float32"),
        rng.normal(size=(rows, 5)).astype("float32"),
    )


def test_two_replica_update_matches_one_device(d4pg):
    import keras

    # Large learning rates and a target copy every step, so that one update moves
    # every weight far more than the tolerance.
    config = d4pg.D4PGConfig(
        batch_size=32,
        hidden_units=(16, 16),
        num_atoms=11,
        v_max=20.0,
        actor_learning_rate=1e-2,
        critic_learning_rate=1e-2,
        target_update_period=1,
    )
    keras.utils.set_random_seed(0)
    distributed = d4pg.Learner(5, 1, config, kr.MultiDeviceReplicator(num_replicas=2))
    one_device = d4pg.Learner(5, 1, config, strategy=None)
    models = ("actor", "critic", "target_actor", "target_critic")
    for name in models:
        getattr(one_device, name).set_weights(getattr(distributed, name).get_weights())
    initial = distributed.weights()

    batches = _batch(2 * config.batch_size, np.random.default_rng(1))
    distributed_losses = distributed.update(batches, num_steps=2)
    one_device_losses = one_device.update(batches, num_steps=2)

    np.testing.assert_allclose(distributed_losses, one_device_losses, rtol=1e-5)
    for a, b in zip(distributed.weights(), one_device.weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    moved = max(np.max(np.abs(a - b)) for a, b in zip(distributed.weights(), initial))
    assert moved > 1e-2
    # The periodic target update copied the online networks.
    for online, target in (("actor", "target_actor"), ("critic", "target_critic")):
        for a, b in zip(
            getattr(distributed, online).get_weights(),
            getattr(distributed, target).get_weights(),
        ):
            np.testing.assert_array_equal(a, b)


@pytest.mark.slow(
    reason="covered in the default run by: test_two_replica_update_matches_one_device"
)
def test_train_runs_on_two_replicas(d4pg):
    config = d4pg.D4PGConfig(
        batch_size=16,
        hidden_units=(16, 16),
        action_repeat=8,
        min_replay_size=100,
        env_steps_per_phase=50,
        updates_per_phase=5,
    )
    run = d4pg.train(
        "cartpole",
        "balance",
        episodes=2,
        num_envs=2,
        config=config,
        strategy=kr.MultiDeviceReplicator(num_replicas=2),
        verbose=False,
    )
    assert len(run.episode_returns) == 2
    assert all(0.0 <= r <= 1000.0 for r in run.episode_returns)
    assert run.env_steps == 2 * 125 and run.learner_steps > 0
    assert all(np.isfinite(run.losses[-1]))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"batch_size": 0}, ValueError, "batch_size=0"),
        ({"n_step": 2.5}, TypeError, "n_step=2.5"),
        ({"discount": 1.5}, ValueError, "discount=1.5"),
        ({"v_min": 10.0, "v_max": 5.0}, ValueError, "v_max=5.0"),
        ({"target_update_rate": 0.01}, ValueError, "target_update_rate=0.01"),
        ({"hidden_units": ()}, ValueError, "hidden_units=()"),
    ],
)
def test_config_rejects_bad_values(d4pg, kwargs, error, match):
    with pytest.raises(error, match=match):
        d4pg.D4PGConfig(**kwargs)


def test_bad_train_and_learner_arguments(d4pg):
    with pytest.raises(ValueError, match="episodes=10"):
        d4pg.train(episodes=10, num_envs=4)
    with pytest.raises(ValueError, match="domain='cartpole', task='juggle'"):
        d4pg.ControlSuiteEnv("cartpole", "juggle")
    with pytest.raises(ValueError, match="batch_size=3"):
        d4pg.Learner(
            5,
            1,
            d4pg.D4PGConfig(batch_size=3),
            kr.MultiDeviceReplicator(num_replicas=2),
        )
    with pytest.raises(TypeError, match="config="):
        d4pg.Learner(5, 1, config={"batch_size": 8})
