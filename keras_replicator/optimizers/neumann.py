"""`Neumann`: Krishnan, Xiao and Saurous' Neumann optimizer as a Keras 3 optimizer.

No implementation of the paper exists for any framework, so this one is written from
Algorithm 2 of arXiv 1712.03298 on `WholeListOptimizer` (see `_whole_list.py`): the
update is computed for all variables at once, because the optional *global* norm of
`w - v` needs every variable, and because one branch (burn-in, reset) is taken for
the whole model.

Design decisions:

- **Displaced weights** (`_displaced_weights.py`). Algorithm 2 stores `w + mu * m`
  (the point where the next gradient is taken), which is why it is Nesterov momentum
  when the regularizers are off. The model therefore holds displaced weights during
  training. The true weights are `w - mu * m` (the paper's `return w_T - mu(T)
  m_T`): `use_true_weights()` moves the model to them in place and marks the
  optimizer "not displaced" (a saved flag); `use_displaced_weights()` moves back.
  Keras' `fit` ends with `finalize_variable_values`, which moves to the true
  weights, so `fit` ends (and `model.save` after `fit` stores) true weights. Keras
  calls nothing on the optimizer when the next `fit` starts, so the
  `UseTrueWeights` callback moves back to the displaced weights before each epoch
  (a continued, loaded or restored run then takes its gradients where the
  uninterrupted one did) and around evaluations inside `fit`. A round trip costs
  one rounding per element, no extra copy. An update that finds the true weights
  (a `fit` without the callback, a custom loop that did not call
  `use_displaced_weights()`) fails before it changes anything: its gradient was
  taken at the wrong point.
- **Step counting.** `t` counts optimizer updates (Keras' `iterations`, so with
  `gradient_accumulation_steps` one update per accumulation cycle), from the end of
  the burn-in. The paper counts the momentum schedule in epochs: `mu_steps` updates
  make one unit of `t` (pass your steps per epoch).
- Where the paper is ambiguous, the class docstring lists the choice ("Choices").
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from keras_replicator import _compat
from keras_replicator.optimizers import _arguments
from keras_replicator.optimizers._displaced_weights import DisplacedWeights
from keras_replicator.optimizers._whole_list import WholeListOptimizer, _raw

REGULARIZER_NORMS = ("variable", "global")
RESET_MODES = ("zero", "gradient")


@keras.saving.register_keras_serializable(package="keras_replicator")
class Neumann(DisplacedWeights, WholeListOptimizer):
    """The Neumann optimizer: an implicit inverse-Hessian step at Adam's cost.

    Krishnan et al. approximate the Newton step of each mini-batch with a Neumann
    series whose Hessian-vector products are replaced by gradients taken at displaced
    weights. Made practical (Algorithm 2), it is Nesterov momentum on a gradient that
    carries a cubic and a repulsive regularizer around a moving average `v` of the
    weights, with a rising momentum and periodic resets. It trained ResNet-50 at
    batch 32k without loss of accuracy, tuning only the learning rate.

    One update with gradient `g` (averaged over replicas), learning rate `lr`, stored
    (displaced) weights `w`, Neumann iterate `m` and average `v`:

    ```python
    if step < burn_in_steps:                 # vanilla SGD, m and v untouched
        w = w - lr * g
    else:
        t = step - burn_in_steps
        if t == 0: v = w                     # start of the Neumann phase
        if t is a reset step: m = 0          # reset_mode="gradient": m = -lr * g
        mu = clip(1 - 1 / (1 + t / mu_steps), mu_min, mu_max)
        r = w - v;  rho = norm(r);  n = size(r)   # per variable or global
        d = g + (alpha * rho - beta * n / rho**3) * r     # d = g if rho == 0
        m = mu * m - lr * d
        w = w + (mu * m - lr * d)
        v = w + gamma * (v - w)
    true_weights = w - mu * m
    ```

    `d` is the gradient of `f + alpha/3 * rho**3 + beta * n / rho`. Resets happen at
    `t = 0, K_0, K_0 + K_1, ...` with `K_j = max(1, floor(reset_steps *
    reset_growth**j))`.

    Choices (where Algorithm 2 is ambiguous; each other choice is an argument):

    - The norm of `w - v` is taken per variable and `beta` is scaled by the
      variable's size (`regularizer_norm="variable"`, what a per-variable TF1
      optimizer computes); `"global"` takes one norm over all variables and scales
      `beta` by the model's parameter count.
    - `d` uses the weights and average *before* the update; `w - v` uses the stored
      (displaced) weights, which are the ones the algorithm writes.
    - `t` in the momentum schedule counts updates since the end of the burn-in, in
      units of `mu_steps`; `mu_since_reset=True` counts from the last reset instead.
    - A reset step is an ordinary step whose previous iterate is 0: it updates `m`,
      `w` and `v` (so the first step equals Nesterov SGD's first step). The literal
      reading of line 7 (`m = -lr * g` before the step) is `reset_mode="gradient"`.
    - The burn-in is vanilla SGD without momentum (the paper's "vanilla SGD");
      `v` starts at the weights reached at its end.

    Args:
        learning_rate: A float >= 0 or a `LearningRateSchedule` (the paper decays it
            over time; any Keras schedule or `kr.scaled_learning_rate` works).
        alpha: Float >= 0, the cubic regularizer. Defaults to `1e-7` (Table 1).
        beta: Float >= 0, the repulsive regularizer per parameter. Defaults to
            `1e-5` (Table 1).
        gamma: Float in `[0, 1]`, the moving-average decay of `v`. Defaults to
            `0.99` (Table 1).
        mu_min: Float in `[0, 1]`, the first momentum. Defaults to `0.5`.
        mu_max: Float in `[mu_min, 1]`, the last momentum. Defaults to `0.9`.
        reset_steps: Int >= 1, the first reset period `K_0` in updates, or `None`
            for no resets. Defaults to `1000`: the paper's period is some epochs
            (it starts with `K` of the order of ten epochs); pass about
            `10 * steps_per_epoch`.
        reset_growth: Float >= 1, the factor between reset periods. Defaults to
            `2.0`.
        burn_in_steps: Int >= 0, updates of vanilla SGD first. Defaults to `0`.
        mu_steps: Float > 0, updates per unit of `t` in the momentum schedule
            (steps per epoch in the paper). Defaults to `100.0`.
        regularizer_norm: `"variable"` or `"global"` (see Choices). Defaults to
            `"variable"`.
        reset_mode: `"zero"` or `"gradient"` (see Choices). Defaults to `"zero"`.
        mu_since_reset: Whether `t` in the momentum schedule restarts at each reset.
            Defaults to `False`.
        name: Name of the optimizer. Defaults to `"neumann"`.
        **optimizer_kwargs: Keras' other optimizer arguments (`clipnorm`,
            `global_clipnorm`, `use_ema`, `gradient_accumulation_steps`, ...).

    Raises:
        ValueError: If a hyperparameter is out of range or a choice is unknown.
        TypeError: If a hyperparameter has the wrong type.

    Example:
    >>> import keras, numpy as np
    >>> from keras_replicator.optimizers import Neumann
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(Neumann(0.05, reset_steps=4), loss="mse")
    >>> x, y = np.ones((16, 4)), np.ones((16, 1))
    >>> _ = model.fit(x, y, batch_size=4, epochs=3, verbose=0)
    >>> bool(model.optimizer.displaced)  # fit ended with the true weights
    False

    References:
        - [Krishnan, Xiao and Saurous, 2017. Neumann Optimizer: A Practical
          Optimization Algorithm for Deep Neural Networks](
          https://arxiv.org/abs/1712.03298)
    """

    def __init__(
        self,
        learning_rate,
        alpha: float = 1e-7,
        beta: float = 1e-5,
        gamma: float = 0.99,
        mu_min: float = 0.5,
        mu_max: float = 0.9,
        reset_steps: int | None = 1000,
        reset_growth: float = 2.0,
        burn_in_steps: int = 0,
        mu_steps: float = 100.0,
        regularizer_norm: str = "variable",
        reset_mode: str = "zero",
        mu_since_reset: bool = False,
        name: str | None = "neumann",
        **optimizer_kwargs,
    ):
        learning_rate = _arguments.check_learning_rate(learning_rate)
        super().__init__(learning_rate=learning_rate, name=name, **optimizer_kwargs)
        self.alpha = _arguments.check_float("alpha", alpha, 0.0)
        self.beta = _arguments.check_float("beta", beta, 0.0)
        self.gamma = _arguments.check_float("gamma", gamma, 0.0, 1.0)
        self.mu_min = _arguments.check_float("mu_min", mu_min, 0.0, 1.0)
        self.mu_max = _arguments.check_float("mu_max", mu_max, 0.0, 1.0)
        if self.mu_max < self.mu_min:
            raise ValueError(
                "`mu_max` must be >= `mu_min`. Received: "
                f"mu_min={self.mu_min}, mu_max={self.mu_max}. Swap them, or pass "
                "equal values for a constant momentum."
            )
        self.reset_steps = _arguments.check_int(
            "reset_steps", reset_steps, 1, allow_none=True
        )
        self.reset_growth = _arguments.check_float("reset_growth", reset_growth, 1.0)
        self.burn_in_steps = _arguments.check_int("burn_in_steps", burn_in_steps, 0)
        self.mu_steps = _arguments.check_float(
            "mu_steps", mu_steps, 0.0, exclusive_low=True
        )
        self.regularizer_norm = _arguments.check_choice(
            "regularizer_norm", regularizer_norm, REGULARIZER_NORMS
        )
        self.reset_mode = _arguments.check_choice("reset_mode", reset_mode, RESET_MODES)
        self.mu_since_reset = _arguments.check_bool("mu_since_reset", mu_since_reset)

    def build(self, var_list):
        """Creates `m` and `v` per variable and the scalar schedule state."""
        if self.built:
            return
        super().build(var_list)
        self._iterates = self.add_optimizer_variables(var_list, "neumann_m")
        self._averages = self.add_optimizer_variables(var_list, "neumann_v")

        def scalar(name, dtype, value):
            return self.add_variable(
                shape=(),
                dtype=dtype,
                initializer=keras.initializers.Constant(value),
                name=name,
            )

        self._mu = scalar("neumann_mu", "float64", 0.0)
        self._displaced = scalar("neumann_displaced", "float64", 0.0)
        self._next_reset = scalar("neumann_next_reset", "int64", 0)
        self._reset_period = scalar(
            "neumann_reset_period", "float64", float(self.reset_steps or 0)
        )
        self._last_reset = scalar("neumann_last_reset", "int64", 0)

    def _new_values(self, grads, variables, learning_rate):
        index = [_compat.optimizer_variable_index(self, v) for v in variables]
        iterates = [self._iterates[i] for i in index]
        averages = [self._averages[i] for i in index]
        weights = [tf.convert_to_tensor(_raw(v)) for v in variables]
        grads = [tf.cast(g, w.dtype) for g, w in zip(grads, weights)]
        m = [tf.convert_to_tensor(_raw(x)) for x in iterates]
        v = [tf.convert_to_tensor(_raw(x)) for x in averages]
        state = (
            self._mu,
            self._displaced,
            self._next_reset,
            self._reset_period,
            self._last_reset,
        )
        scalars = [tf.convert_to_tensor(_raw(x)) for x in state]
        weights, m, v, scalars = _at_displaced_weights(scalars, weights, m, v, scalars)
        step = tf.cast(self.iterations, "int64")
        lr = tf.cast(learning_rate, "float64")

        def neumann():
            return self._neumann_step(step, lr, grads, weights, m, v, scalars)

        if self.burn_in_steps == 0:
            new = neumann()
        else:

            def burn_in():
                new_w = [w - tf.cast(lr, w.dtype) * g for w, g in zip(weights, grads)]
                return new_w, m, v, scalars

            new = tf.cond(step < self.burn_in_steps, burn_in, neumann)
        new_w, new_m, new_v, new_scalars = new
        return (
            list(zip(variables, new_w))
            + list(zip(iterates, new_m))
            + list(zip(averages, new_v))
            + list(zip(state, new_scalars))
        )

    def _neumann_step(self, step, lr, grads, weights, m, v, scalars):
        mu_last, displaced, next_reset, period, last_reset = scalars
        t = step - self.burn_in_steps
        # Re-apply the displacement `use_true_weights()` took out, where the check
        # of `_at_displaced_weights` cannot stop the step (XLA drops assertions).
        weights = [
            w + tf.cast((1.0 - displaced) * mu_last, w.dtype) * mi
            for w, mi in zip(weights, m)
        ]
        first = tf.equal(t, 0)
        v = [tf.where(first, w, vi) for w, vi in zip(weights, v)]
        if self.reset_steps is None:
            reset = tf.constant(False)
        else:
            reset = t >= next_reset
            increment = tf.maximum(tf.cast(tf.floor(period), "int64"), 1)
            next_reset = tf.where(reset, next_reset + increment, next_reset)
            period = tf.where(reset, period * self.reset_growth, period)
            last_reset = tf.where(reset, t, last_reset)
        if self.reset_mode == "zero":
            m = [tf.where(reset, tf.zeros_like(mi), mi) for mi in m]
        else:
            m = [
                tf.where(reset, -tf.cast(lr, g.dtype) * g, mi)
                for mi, g in zip(m, grads)
            ]
        schedule_t = t - last_reset if self.mu_since_reset else t
        mu = 1.0 - 1.0 / (1.0 + tf.cast(schedule_t, "float64") / self.mu_steps)
        mu = tf.clip_by_value(mu, self.mu_min, self.mu_max)

        coefficients = regularizer_coefficients(
            [w - vi for w, vi in zip(weights, v)],
            self.alpha,
            self.beta,
            self.regularizer_norm,
        )
        new_w, new_m, new_v = [], [], []
        for w, g, mi, vi, coefficient in zip(weights, grads, m, v, coefficients):
            dtype = w.dtype
            d = g + tf.cast(coefficient, dtype) * (w - vi)
            mi = tf.cast(mu, dtype) * mi - tf.cast(lr, dtype) * d
            # Keras' SGD association (`w + (mu * m - lr * d)`): bit-equal to it.
            w = w + (tf.cast(mu, dtype) * mi - tf.cast(lr, dtype) * d)
            new_m.append(mi)
            new_w.append(w)
            new_v.append(w + tf.constant(self.gamma, dtype) * (vi - w))
        displaced = tf.ones((), "float64")
        return new_w, new_m, new_v, [mu, displaced, next_reset, period, last_reset]

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "alpha": self.alpha,
                "beta": self.beta,
                "gamma": self.gamma,
                "mu_min": self.mu_min,
                "mu_max": self.mu_max,
                "reset_steps": self.reset_steps,
                "reset_growth": self.reset_growth,
                "burn_in_steps": self.burn_in_steps,
                "mu_steps": self.mu_steps,
                "regularizer_norm": self.regularizer_norm,
                "reset_mode": self.reset_mode,
                "mu_since_reset": self.mu_since_reset,
            }
        )
        return config


_AT_TRUE_WEIGHTS = (
    "`Neumann` was asked for an update while the model holds its true weights "
    "(after `fit`, `use_true_weights()` or loading a model), so the gradient was "
    "taken at the wrong point. Pass `keras_replicator.optimizers.UseTrueWeights()` "
    "in the `callbacks` of every `fit` that continues training, or call "
    "`optimizer.use_displaced_weights()` before a custom training loop."
)


def _at_displaced_weights(scalars, *values):
    """`values`, once the model is known to hold the displaced weights."""
    mu, displaced = scalars[0], scalars[1]
    at_true = tf.logical_and(tf.equal(displaced, 0.0), tf.not_equal(mu, 0.0))
    check = tf.debugging.Assert(tf.logical_not(at_true), [_AT_TRUE_WEIGHTS])
    with tf.control_dependencies([check]):
        return [[tf.identity(x) for x in group] for group in values]


def regularizer_coefficients(differences, alpha, beta, norm):
    """`alpha * rho - beta * n / rho**3` per variable (0 where `rho == 0`)."""
    squares = [tf.cast(tf.reduce_sum(tf.square(r)), "float64") for r in differences]
    sizes = [float(np.prod(r.shape)) for r in differences]
    if norm == "global":
        squares = [tf.add_n(squares)] * len(differences)
        sizes = [math.fsum(sizes)] * len(differences)
    coefficients = []
    for square, size in zip(squares, sizes):
        positive = square > 0
        rho = tf.sqrt(tf.where(positive, square, tf.ones_like(square)))
        value = alpha * rho - beta * size / (rho * rho * rho)
        coefficients.append(tf.where(positive, value, tf.zeros_like(value)))
    return coefficients
