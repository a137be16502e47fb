"""The learner: where the replica API appears (`Learner.step_fn`, `update`)."""

from __future__ import annotations

import contextlib

import keras
import numpy as np
import tensorflow as tf

import keras_replicator as kr
from d4pg.config import D4PGConfig, check_positive_int
from d4pg.networks import build_actor, build_critic
from d4pg.projection import categorical_projection


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
        check_positive_int("num_steps", num_steps)
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
