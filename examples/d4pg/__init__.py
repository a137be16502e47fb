"""D4PG on the DeepMind Control Suite, with the learner on keras_replicator.

TF-Replicator's paper (Buchlovsky et al. 2019) validated its design on a D4PG agent
on the DeepMind Control Suite. This package is a small, self-contained D4PG
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

Where keras_replicator appears (all in `learner.py`): the learner's networks,
optimizers and target networks are created under `strategy.scope()`;
`Learner.step_fn` is written for one replica with per-replica mean losses (Keras
optimizers under keras_replicator strategies average gradients exactly across
replicas); each learner phase samples `num_steps` global batches from replay, feeds
them through `strategy.distribute_input(input_fn)` (each replica gets its share of
every global batch) and runs `strategy.run_steps(step_fn, iterator, num_steps=...,
reduce="mean")`. The sampling happens on the host with a seeded NumPy generator, so
a run is reproducible. The target-network update is a cross-replica write of
mirrored variables, done with `merge_call` from inside the replica step.

The agent learns from the environments' state observations. Pixels (MuJoCo renders
headless with `MUJOCO_GL=egl` where EGL is installed) would need a convolutional
encoder and far more samples than a short CPU run allows. Importing this package
sets `MUJOCO_GL=disable` unless it is already set: no renderer is needed for states,
and it silences GLFW's missing-`DISPLAY` warning on headless machines.

One module per concept: `config` (hyperparameters), `projection` (the categorical
projection), `networks` (actor and critic), `environment` (Control Suite wrapper),
`replay` (N-step transitions, replay buffer), `learner` (the replica step),
`actors` (acting with exploration noise) and `training` (`train`, `evaluate`).

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

import os

# Before TensorFlow and MuJoCo load (see above).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MUJOCO_GL", "disable")

from d4pg.actors import Actors  # noqa: E402
from d4pg.config import SMALL_CONFIG, D4PGConfig  # noqa: E402
from d4pg.environment import ControlSuiteEnv, flatten_observation  # noqa: E402
from d4pg.learner import Learner  # noqa: E402
from d4pg.networks import build_actor, build_critic  # noqa: E402
from d4pg.projection import categorical_projection  # noqa: E402
from d4pg.replay import NStepWriter, ReplayBuffer  # noqa: E402
from d4pg.training import TrainingRun, evaluate, train  # noqa: E402

__all__ = [
    "SMALL_CONFIG",
    "Actors",
    "ControlSuiteEnv",
    "D4PGConfig",
    "Learner",
    "NStepWriter",
    "ReplayBuffer",
    "TrainingRun",
    "build_actor",
    "build_critic",
    "categorical_projection",
    "evaluate",
    "flatten_observation",
    "train",
]
