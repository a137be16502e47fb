"""`NLCG`: Adya et al.'s preconditioned nonlinear conjugate gradients for Keras 3.

The authors' code (apple/ml-ncg) is a TF1 Horovod optimizer; Keras 3 has no
conjugate-gradient optimizer, so this one is written from the paper (arXiv
1812.02886) and the algorithm its code describes, on `WholeListOptimizer` (see
`_whole_list.py`): conjugate gradients treat all variables as one vector, so every
dot product (the `beta` of the recurrence, the BFGS curvature pair) is **global**,
computed once per step from the all-reduced gradient. All replicas compute the same
scalars and take the same branches.

Design decisions:

- **The loss.** Step control needs the training loss, which Keras optimizers never
  see in `apply_gradients`. But Keras' `train_step` asks the optimizer to scale the
  loss it differentiates (`scale_loss`, inside the tape, before
  `apply_gradients`): NLCG's `scale_loss` records it, as the global-batch mean
  (`_loss_aware.observe_scaled_loss`), so `fit` needs nothing installed, on one
  device and under every strategy. Custom loops (and a `train_step` that does not
  call `scale_loss`) call `keras_replicator.optimizers.observe_loss` before
  `apply_gradients`. With `gradient_accumulation_steps` the losses observed
  between two updates are averaged (`_observed_losses.py`). The variables use
  Keras' `"only_first_replica"` aggregation, so even a wrongly-passed local loss
  cannot make replicas take different branches (it only makes the step control
  use replica 0's loss). A step that runs with `step_control=True` and no loss
  ever given fails while the step is traced.
- **Timing of the step control.** apple/ml-ncg's TF1 graph (run with the loss
  ready before the gradient; our NumPy transcription matched it to float32
  rounding) reads the step multiplier, the loss average and the previous
  direction before that step's own assignments. Ours follows it until a check
  cuts the step, and departs at cuts in two ways: a check compares the loss
  average *after* this update's loss (the authors': before it), and a new
  multiplier applies to this update (the authors': from the next). A take-back
  is the authors' blend, `update = lr * ((1 - p) * c_new * d - p * c * d_prev)`;
  the stored direction stays `d` and the BFGS `s` is `lr * c * d_prev`, as in
  their code. With the authors' timing NLCG lost 31 points at batch 2,000 on
  mnist1d (docs/optimizers.md); `_nlcg_steps.AUTHORS_TIMING` (private) switches
  each part.
- The diagonal BFGS update adds no epsilon to its numerators (the authors' code adds
  `1e-8` to each); `beta`'s denominator has no epsilon either (a zero denominator
  gives `beta = 0`), so without preconditioner and step control the optimizer is
  textbook Fletcher-Reeves.
- The loss-trend bands compare the relative change `(ema - ema_old) / |ema_old|`
  with the thresholds of the authors' code, i.e. `ratio - 1` for positive losses.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_replicator import _compat
from keras_replicator.optimizers import _arguments, _loss_aware, _nlcg_steps
from keras_replicator.optimizers._observed_losses import ObservedLosses
from keras_replicator.optimizers._whole_list import WholeListOptimizer, _raw

BETA_RULES = ("fr", "pr")
PRECONDITIONERS = ("diag_bfgs", None)

# The step-control bands live in `_nlcg_steps.STEP_CONTROL_BANDS`.


@keras.saving.register_keras_serializable(package="keras_replicator")
class NLCG(WholeListOptimizer):
    """Preconditioned nonlinear conjugate gradients for very large batches.

    At batch sizes of 16k-65k the gradient is nearly exact, and Adya et al. show
    that conjugate directions then beat momentum SGD (+10 top-1 points on ImageNet
    beyond batch 65k). The direction mixes the (preconditioned) negative gradient
    with the previous direction; a loss-trend rule scales the step.

    One update with gradient `g` (averaged over replicas), learning rate `lr`,
    weights `w`, all vectors being the concatenation of every variable:

    ```python
    if lars_eta: g_l = g_l * lars_eta * norm(w_l) / norm(g_l)  # per variable l
    r = -g
    if preconditioner == "diag_bfgs" and step > 0:    # B starts at ones
        y, s = g - g_prev, lr * c * d_prev
        if y @ s > eps and s @ (B * s) > eps:
            B = abs(B - (B * s)**2 / (s @ (B * s)) + y**2 / (y @ s))
        z = r / (B + eps)
    else:
        z = r
    if step == 0: d = z
    else:
        beta = (r @ z) / rz_prev                       # "fr"
        beta = (r @ z - r @ z_prev) / rz_prev          # "pr"
        d = z + clip(beta, 0, 1) * d_prev
    update = lr * c * d                                # c: the step multiplier
    w = w + update
    ```

    Step control (`step_control=True`, the authors' "Step" search): `ema` smooths
    the observed loss (`ema = s * ema + (1 - s) * loss`, `s = loss_smoothing`).
    Every `step_control_period` updates the relative change of `ema` since the
    last check picks a band of `_nlcg_steps.STEP_CONTROL_BANDS`: a fall or a rise
    under 1% (times `step_control_threshold`) multiplies `c` by 1.05 (at most 1);
    a larger rise multiplies it by the band's factor (at least 1e-4) and takes
    back a share `p` of the previous step: `update = lr * ((1 - p) * c_new * d -
    p * c * d_prev)`. The new `c` applies from this update on.

    Args:
        learning_rate: A float >= 0 or a `LearningRateSchedule`.
        beta_rule: `"fr"` (Fletcher-Reeves) or `"pr"` (Polak-Ribiere). `beta` is
            clipped to `[0, 1]`. Defaults to `"fr"`.
        preconditioner: `"diag_bfgs"` or `None`. Defaults to `"diag_bfgs"`.
        step_control: Whether to use the loss-trend step control; needs the loss
            (see `set_loss`). Defaults to `True`.
        lars_eta: Float > 0 for LARS-style layer-wise scaling of the gradient
            before the direction is formed (the authors use `0.001`), or `None`.
            Defaults to `None`.
        step_control_period: Int >= 1, updates between two loss-trend checks.
            Defaults to `5`.
        step_control_threshold: Float > 0 scaling the band thresholds. Defaults
            to `1.0`.
        loss_smoothing: Float in `[0, 1)`, the decay of the loss average.
            Defaults to `0.7`.
        epsilon: Float > 0, the BFGS curvature threshold and diagonal floor.
            Defaults to `1e-8`.
        name: Name of the optimizer. Defaults to `"nlcg"`.
        **optimizer_kwargs: Keras' other optimizer arguments (`global_clipnorm`,
            `use_ema`, `gradient_accumulation_steps`, ...).

    Raises:
        ValueError: If a hyperparameter is out of range or a choice is unknown.
        TypeError: If a hyperparameter has the wrong type.

    Example:
    >>> import keras, numpy as np
    >>> from keras_replicator.optimizers import NLCG, observe_loss
    >>> variable = keras.Variable(np.ones(3))
    >>> optimizer = NLCG(0.1, step_control=True)
    >>> for step in range(3):
    ...     observe_loss(optimizer, keras.ops.sum(variable**2))
    ...     optimizer.apply([2 * variable.value], [variable])
    >>> float(optimizer.step_multiplier)
    1.0

    References:
        - [Adya et al., 2018. Nonlinear Conjugate Gradients For Scaling
          Synchronous Distributed DNN Training](https://arxiv.org/abs/1812.02886)
    """

    def __init__(
        self,
        learning_rate,
        beta_rule: str = "fr",
        preconditioner: str | None = "diag_bfgs",
        step_control: bool = True,
        lars_eta: float | None = None,
        step_control_period: int = 5,
        step_control_threshold: float = 1.0,
        loss_smoothing: float = 0.7,
        epsilon: float = 1e-8,
        name: str | None = "nlcg",
        **optimizer_kwargs,
    ):
        learning_rate = _arguments.check_learning_rate(learning_rate)
        super().__init__(learning_rate=learning_rate, name=name, **optimizer_kwargs)
        if isinstance(beta_rule, str):
            beta_rule = beta_rule.lower()
        self.beta_rule = _arguments.check_choice("beta_rule", beta_rule, BETA_RULES)
        self.preconditioner = _arguments.check_choice(
            "preconditioner", preconditioner, PRECONDITIONERS
        )
        self.step_control = _arguments.check_bool("step_control", step_control)
        self.lars_eta = None
        if lars_eta is not None:
            self.lars_eta = _arguments.check_float(
                "lars_eta", lars_eta, 0.0, exclusive_low=True
            )
        self.step_control_period = _arguments.check_int(
            "step_control_period", step_control_period, 1
        )
        self.step_control_threshold = _arguments.check_float(
            "step_control_threshold", step_control_threshold, 0.0, exclusive_low=True
        )
        self.loss_smoothing = _arguments.check_float(
            "loss_smoothing", loss_smoothing, 0.0, 1.0
        )
        if self.loss_smoothing == 1.0:
            raise ValueError(
                "`loss_smoothing` must be < 1 (1 would ignore every new loss). "
                "Received: loss_smoothing=1.0. Pass e.g. 0.7."
            )
        self.epsilon = _arguments.check_float(
            "epsilon", epsilon, 0.0, exclusive_low=True
        )
        self._losses = ObservedLosses(self, "nlcg") if self.step_control else None

    @property
    def uses_loss(self) -> bool:
        """Whether `set_loss` must be called before each update."""
        return self.step_control

    def scale_loss(self, loss):
        """Scales `loss` as any Keras optimizer does, and records it.

        Keras' `train_step` calls it inside the tape with the loss it
        differentiates, before `apply_gradients`: this is how `fit` hands NLCG
        the training loss (as the global-batch mean). A later `observe_loss` in
        the same step replaces it.
        """
        if self.step_control and loss is not None:
            _loss_aware.observe_scaled_loss(self, loss)
        return super().scale_loss(loss)

    def set_loss(self, loss) -> None:
        """Hands the optimizer the training loss of the coming update.

        Call it in the train step, before `apply_gradients`, with the
        **global-batch mean loss** (all-reduced over replicas: a replica's local
        loss would steer the step control by one replica's batch); a second call
        in the same step replaces the first. A no-op when `step_control=False`.
        Prefer `keras_replicator.optimizers.observe_loss`, which also accepts
        optimizers that need no loss.

        Args:
            loss: A scalar tensor (or float).

        Raises:
            ValueError: If `loss` is not a scalar.
        """
        if self._losses is None:  # step_control=False
            return
        # A Python float stays exact (float64), like the state it feeds.
        loss = tf.convert_to_tensor(loss, dtype_hint="float64")
        if loss.shape.rank not in (None, 0):
            raise ValueError(
                "`loss` must be a scalar. Received: loss with shape "
                f"{loss.shape}. Pass the mean loss over the global batch."
            )
        self._losses.add(tf.cast(loss, "float64"))

    @property
    def step_multiplier(self):
        """The step-control multiplier `c` (a scalar variable, 1 at the start)."""
        return self._multiplier

    def _scalar(self, name, value, aggregation="none", dtype="float64"):
        return self.add_variable(
            shape=(),
            dtype=dtype,
            initializer=keras.initializers.Constant(value),
            aggregation=aggregation,
            name=name,
        )

    def build(self, var_list):
        """Creates the direction, gradient and preconditioner slots."""
        if self.built:
            return
        _nlcg_steps.refuse_parameter_servers(_compat.optimizer.optimizer_strategy(self))
        _nlcg_steps.refuse_parameter_servers(tf.distribute.get_strategy())
        super().build(var_list)
        self._directions = self.add_optimizer_variables(var_list, "nlcg_d")
        bfgs = self.preconditioner == "diag_bfgs"
        if bfgs:
            self._previous_grads = self.add_optimizer_variables(var_list, "nlcg_g")
            self._diagonals = self.add_optimizer_variables(
                var_list, "nlcg_b", initializer="ones"
            )
        if self.beta_rule == "pr":
            # Polak-Ribiere needs the previous preconditioned residual z.
            self._previous_z = self.add_optimizer_variables(var_list, "nlcg_z")
        self._rz = self._scalar("nlcg_rz", 0.0)
        self._multiplier = self._scalar("nlcg_multiplier", 1.0)
        if self.step_control:
            self._loss_ema = self._scalar("nlcg_loss_ema", 0.0)
            self._loss_ema_old = self._scalar("nlcg_loss_ema_old", 0.0)
        # The step-control timing (private switch, see `_nlcg_steps`).
        self._timing = dict(_nlcg_steps.AUTHORS_TIMING)
        self._prev_scale = None
        if not (self._timing["c"] and self._timing["e"]):
            self._prev_scale = self._scalar("nlcg_prev_scale", 0.0)

    def _slots(self, name, index):
        slots = getattr(self, name, None)
        return None if slots is None else [slots[i] for i in index]

    def _new_values(self, grads, variables, learning_rate):
        if self.step_control and not self._losses.given:
            raise ValueError(
                "`NLCG(step_control=True)` needs the training loss, and none was "
                "given (Keras' `LossScaleOptimizer` does not pass on the loss it "
                "scales). In the train step, call "
                "`keras_replicator.optimizers.observe_loss(optimizer, loss)` with "
                "the global-batch mean loss before `apply_gradients`, or pass "
                "`step_control=False`."
            )
        index = [_compat.optimizer_variable_index(self, v) for v in variables]
        weights = [tf.convert_to_tensor(_raw(v)) for v in variables]
        grads = [tf.cast(g, w.dtype) for g, w in zip(grads, weights)]
        directions = self._slots("_directions", index)
        previous_grads = self._slots("_previous_grads", index)
        diagonals = self._slots("_diagonals", index)
        previous_z = self._slots("_previous_z", index)
        d_prev = _nlcg_steps.read(directions)
        step = tf.cast(self.iterations, "int64")
        first = tf.equal(step, 0)
        lr = tf.cast(learning_rate, "float64")
        multiplier = tf.convert_to_tensor(_raw(self._multiplier))
        scale = lr * multiplier  # before this update's check
        prev_scale = None
        if self._prev_scale is not None:
            prev_scale = tf.convert_to_tensor(_raw(self._prev_scale))
        updates = []

        if self.lars_eta is not None:
            grads = [
                _nlcg_steps.lars(g, w, self.lars_eta) for g, w in zip(grads, weights)
            ]
        residuals = [-g for g in grads]
        if self.preconditioner == "diag_bfgs":
            b = _nlcg_steps.bfgs_diagonal(
                first,
                grads,
                _nlcg_steps.read(previous_grads),
                d_prev,
                scale if self._timing["e"] else prev_scale,
                _nlcg_steps.read(diagonals),
                self.epsilon,
            )
            z = [
                r / (bi + tf.constant(self.epsilon, bi.dtype))
                for r, bi in zip(residuals, b)
            ]
            updates += list(zip(diagonals, b)) + list(zip(previous_grads, grads))
        else:
            z = residuals
        rz = _nlcg_steps.dot(residuals, z)
        rz_prev = tf.convert_to_tensor(_raw(self._rz))
        numerator = rz
        if self.beta_rule == "pr":
            numerator = rz - _nlcg_steps.dot(residuals, _nlcg_steps.read(previous_z))
        positive = rz_prev > 0
        safe = tf.where(positive, rz_prev, tf.ones_like(rz_prev))
        beta = tf.where(positive, numerator / safe, tf.zeros_like(rz))
        beta = tf.where(first, tf.zeros_like(beta), tf.clip_by_value(beta, 0.0, 1.0))
        d = [zi + tf.cast(beta, zi.dtype) * dp for zi, dp in zip(z, d_prev)]

        if self.step_control:
            new_multiplier, share, loss_updates = self._step_control(first, multiplier)
            updates += loss_updates + [(self._multiplier, new_multiplier)]
            deltas, d, scale = _nlcg_steps.take_back(
                d, d_prev, scale, lr * new_multiplier, prev_scale, share, self._timing
            )
        else:
            deltas = [tf.cast(scale, di.dtype) * di for di in d]
        updates += [(v, w + u) for v, w, u in zip(variables, weights, deltas)]
        updates += list(zip(directions, d))
        if self._prev_scale is not None:
            updates.append((self._prev_scale, scale))
        if previous_z is not None:
            updates += list(zip(previous_z, z))
        updates.append((self._rz, rz))
        return updates

    def _step_control(self, first, multiplier):
        """The new multiplier, the share taken back and the loss-state updates."""
        ema = tf.convert_to_tensor(_raw(self._loss_ema))
        ema_old = tf.convert_to_tensor(_raw(self._loss_ema_old))
        # No loss since the last update (set_loss called elsewhere): no new evidence.
        loss = self._losses.mean(ema)
        step = tf.cast(self.iterations, "int64")
        check = tf.logical_and(
            tf.logical_not(first),
            tf.equal(tf.math.floormod(step, self.step_control_period), 0),
        )
        multiplier, share, ema, ema_old = _nlcg_steps.step_control(
            first,
            check,
            multiplier,
            loss,
            ema,
            ema_old,
            self.loss_smoothing,
            self.step_control_threshold,
            lagged=self._timing["a"],
        )
        updates = [(self._loss_ema, ema), (self._loss_ema_old, ema_old)]
        updates += self._losses.reset()
        return multiplier, share, updates

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "beta_rule": self.beta_rule,
                "preconditioner": self.preconditioner,
                "step_control": self.step_control,
                "lars_eta": self.lars_eta,
                "step_control_period": self.step_control_period,
                "step_control_threshold": self.step_control_threshold,
                "loss_smoothing": self.loss_smoothing,
                "epsilon": self.epsilon,
            }
        )
        return config
