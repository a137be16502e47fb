"""`LARS`: SGD with momentum and a layer-wise trust ratio, as a Keras 3 optimizer.

Keras 3 ships no LARS, and the one Keras LARS that exists (TF Model Garden) is built
on the legacy `tf_keras` optimizers, so this one is written by hand on the public
`keras.optimizers.Optimizer` subclassing API (`build`, `update_step`, `get_config`).

Why that is enough to be correct under every Replicator strategy: Keras' TensorFlow
optimizer all-reduces the gradients (our strategies make it a sample-weighted mean)
*before* it calls `update_step` once per variable and device. The norms below are
therefore taken on the global-batch gradient, and every replica computes the same trust
ratio and the same update; no collective is needed here. Under weight-update sharding
(`kr.AllReduceOptions(shard_weight_update=True)`) each replica updates one piece of each
variable; the step is then cut where the norms are taken (`sharded_partial_squares`,
`sharded_finish`) and the library sums the pieces' squares across replicas in between.

Two things differ from Keras' other optimizers on purpose:

- `weight_decay` is *coupled* (added to the gradient before the trust ratio, as in
  You et al.), not Keras' decoupled decay (`w -= lr * wd * w` before the step). The
  value is kept in `weight_decay_rate`; the base class' `weight_decay` attribute stays
  `None` so the base class does not decay the weights a second time.
- The trust ratio each variable last used is kept in a scalar optimizer variable, so
  that `keras_replicator.callbacks.TrustRatioLogger` (and users) can see LARS at work.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import keras
import tensorflow as tf
from keras import ops

from keras_replicator import _compat
from keras_replicator.optimizers._arguments import check_float, is_number

#: Variables whose path ends in one of these get no weight decay and no trust ratio
#: (biases and the scale / offset of batch and layer normalization), as in You et al.
#: and the MLPerf ResNet-50 reference.
DEFAULT_EXCLUDE = ("bias$", "gamma$", "beta$")


@keras.saving.register_keras_serializable(package="keras_replicator")
class LARS(keras.optimizers.Optimizer):
    """Layer-wise Adaptive Rate Scaling: SGD whose step per layer follows its weights.

    At large batch sizes a single learning rate is too large for some layers (they
    diverge) and too small for others. LARS scales each variable's step by a *trust
    ratio* `eeta * ||w|| / ||g + wd * w||`, so each layer moves by about the same
    fraction `learning_rate * eeta` of its norm per step. With warmup it trained
    ResNet-50 at batch 32k without loss of accuracy (You et al. 2017).

    Update per variable `w` with gradient `g` (already averaged over replicas), learning
    rate `lr`, momentum `m` and velocity `v` (starting at 0):

    ```python
    d = g + weight_decay * w                      # no decay if excluded
    trust = eeta * norm(w) / (norm(d) + epsilon)  # 1 if excluded or a norm is 0
    v = m * v + lr * trust * d
    w = w - v                  # nesterov: w = w - (m * v + lr * trust * d)
    ```

    Exclusion patterns are regular expressions searched (`re.search`) in each
    variable's path, e.g. `"sequential/dense/bias"`. The learning rate is inside the
    velocity, as in Keras' `SGD`, so `keras_replicator.callbacks.LearningRateWarmup`
    can apply Goyal et al.'s momentum correction.

    Args:
        learning_rate: A float, or a `keras.optimizers.schedules.LearningRateSchedule`
            such as `keras_replicator.schedules.PolynomialDecayWithWarmup`. With LARS
            a kernel moves by about `learning_rate * eeta` of its norm per step, so
            with the default `eeta` values are much larger than for SGD (MLPerf
            ResNet-50 LARS configurations use about 10).
        momentum: Float in `[0, 1]`. Defaults to `0.9`.
        weight_decay: Float >= 0 (or `None`, meaning 0), coupled L2 decay (see
            above). Defaults to `0.0`, like Keras' other optimizers; large-batch
            ImageNet recipes use `1e-5` to `5e-4`.
        eeta: Float > 0, the trust coefficient. Defaults to `0.001` (You et al.).
        epsilon: Float >= 0 added to the denominator of the trust ratio. Defaults to
            `0.0` (MLPerf); zero norms already give a trust ratio of 1.
        nesterov: Whether to use Nesterov momentum. Defaults to `False`.
        exclude_from_weight_decay: Regular expressions; matching variables get no
            weight decay. Defaults to `DEFAULT_EXCLUDE`, i.e. paths ending in `bias`,
            `gamma` or `beta`. Pass `()` to decay every variable.
        exclude_from_layer_adaptation: Regular expressions; matching variables use a
            trust ratio of 1 (plain momentum SGD). Defaults to `DEFAULT_EXCLUDE`.
        name: Name of the optimizer. Defaults to `"lars"`.
        **kwargs: Keras' other optimizer arguments (`clipnorm`, `global_clipnorm`,
            `use_ema`, `gradient_accumulation_steps`, ...). Keras' decoupled
            `weight_decay` is not available: LARS' own `weight_decay` replaces it.

    Attributes:
        weight_decay_rate: The coupled weight decay passed as `weight_decay`.
        trust_ratios: `{variable path: scalar variable}` holding the trust ratio of the
            last step (available once the optimizer is built).

    Raises:
        ValueError: If a hyperparameter is out of range or a pattern is not a valid
            regular expression.
        TypeError: If a hyperparameter is not a number (`nesterov`: not a bool),
            or an exclusion list is a single string or holds non-strings.

    Example:
    >>> import keras, numpy as np
    >>> from keras_replicator.optimizers import LARS
    >>> model = keras.Sequential(
    ...     [keras.Input((4,)), keras.layers.Dense(2, name="dense")], name="model")
    >>> model.compile(LARS(learning_rate=1.0, weight_decay=1e-4), loss="mse")
    >>> x, y = np.ones((8, 4)), np.zeros((8, 2))
    >>> _ = model.fit(x, y, epochs=2, verbose=0)
    >>> model.optimizer.adapted_paths()  # the bias is excluded by default
    ['model/dense/kernel']
    >>> 0 < float(model.optimizer.trust_ratios["model/dense/kernel"]) < 1
    True

    References:
        - [You et al., 2017. Large Batch Training of Convolutional Networks](
          https://arxiv.org/abs/1708.03888)
        - [Goyal et al., 2017. Accurate, Large Minibatch SGD: Training ImageNet in
          1 Hour](https://arxiv.org/abs/1706.02677) (momentum correction)
    """

    def __init__(
        self,
        learning_rate: float | keras.optimizers.schedules.LearningRateSchedule,
        momentum: float = 0.9,
        weight_decay: float | None = 0.0,
        eeta: float = 0.001,
        epsilon: float = 0.0,
        nesterov: bool = False,
        exclude_from_weight_decay: Sequence[str] = DEFAULT_EXCLUDE,
        exclude_from_layer_adaptation: Sequence[str] = DEFAULT_EXCLUDE,
        name: str | None = "lars",
        **kwargs,
    ):
        if is_number(learning_rate):
            learning_rate = float(learning_rate)
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.momentum = check_float("momentum", momentum, 0.0, 1.0)
        self.weight_decay_rate = check_float(
            "weight_decay", 0.0 if weight_decay is None else weight_decay, 0.0
        )
        self.eeta = check_float("eeta", eeta, 0.0, exclusive_low=True)
        self.epsilon = check_float("epsilon", epsilon, 0.0)
        if not isinstance(nesterov, bool):
            raise TypeError(
                f"`nesterov` must be a bool. Received: nesterov={nesterov!r}. "
                "Pass True or False."
            )
        self.nesterov = nesterov
        self._weight_decay_exclusions = _check_patterns(
            "exclude_from_weight_decay", exclude_from_weight_decay
        )
        self._adaptation_exclusions = _check_patterns(
            "exclude_from_layer_adaptation", exclude_from_layer_adaptation
        )

    def exclude_from_weight_decay(self, var_list=None, var_names=None) -> None:
        """Excludes variables from LARS' weight decay; call before the first step.

        Keras' method of the same name configures the base class' decoupled decay,
        which LARS does not use; this override applies to LARS' own decay instead.

        Args:
            var_list: Variables to exclude (matched by their exact path).
                Defaults to `None`.
            var_names: Regular expressions that replace the
                `exclude_from_weight_decay` patterns. Defaults to `None` (keep them).

        Raises:
            ValueError: If the optimizer is already built.
        """
        if self.built:
            raise ValueError(
                "`exclude_from_weight_decay()` must be called before the optimizer "
                "is built (before the first training step). Pass the patterns as "
                "`LARS(exclude_from_weight_decay=...)` instead."
            )
        patterns = self._weight_decay_exclusions
        if var_names is not None:
            patterns = _check_patterns("var_names", var_names)
        for variable in var_list or ():
            patterns += ("^" + re.escape(_path(variable)) + "$",)
        self._weight_decay_exclusions = patterns

    def build(self, var_list):
        """Creates the momentum and trust-ratio variables and resolves exclusions."""
        if self.built:
            return
        super().build(var_list)
        if self.momentum != 0:
            self.momentums = self.add_optimizer_variables(var_list, "momentum")
        else:
            self.momentums = [None] * len(var_list)
        self._paths = [_path(variable) for variable in var_list]
        self._trust_ratio_variables = [
            self.add_variable(
                shape=(),
                initializer="ones",
                dtype="float32",
                name=path.replace("/", "_") + "_trust_ratio",
            )
            for path in self._paths
        ]
        decay = _compile(self._weight_decay_exclusions)
        adapt = _compile(self._adaptation_exclusions)
        self._decays = [
            self.weight_decay_rate > 0 and not _matches(decay, path)
            for path in self._paths
        ]
        self._adapts = [not _matches(adapt, path) for path in self._paths]

    @property
    def trust_ratios(self) -> dict:
        """`{variable path: scalar variable}`: each trust ratio of the last step."""
        if not self.built:
            return {}
        return dict(zip(self._paths, self._trust_ratio_variables))

    def adapted_paths(self) -> list[str]:
        """Paths of the variables that get a trust ratio (not excluded)."""
        if not self.built:
            return []
        return [path for path, adapt in zip(self._paths, self._adapts) if adapt]

    def update_step(self, gradient, variable, learning_rate):
        """Applies one LARS step to `variable` (see the class docstring)."""
        # `_get_variable_index` is the lookup Keras' own Optimizer docstring shows for
        # subclasses: under a strategy `variable` is a per-device component, and only
        # the base class maps it back to its slot.
        index = _compat.optimizer_variable_index(self, variable)
        direction = self._direction(gradient, variable, index)
        squares = None
        if self._adapts[index]:
            squares = _squares(variable, direction)
        self._finish(variable, index, direction, squares, learning_rate)

    # Weight-update sharding (`keras_replicator.sharding`) updates one piece of a
    # variable per replica; the trust ratio needs the whole variable's norms, so
    # the step is cut where they are taken: each replica's sums of squares are
    # added over all replicas (one small all-reduce) before `sharded_finish`.
    def sharded_partial_squares(self, gradient, variable):
        """`(sums of squares of this piece's weights and direction, state)`."""
        index = _compat.optimizer_variable_index(self, variable)
        direction = self._direction(gradient, variable, index)
        return _squares(variable, direction), direction

    def sharded_finish(self, gradient, variable, learning_rate, squares, direction):
        """The rest of the step, with `squares` summed over every piece."""
        index = _compat.optimizer_variable_index(self, variable)
        if not self._adapts[index]:
            squares = None
        self._finish(variable, index, direction, squares, learning_rate)

    def _direction(self, gradient, variable, index):
        dtype = variable.dtype
        direction = ops.cast(_dense(gradient), dtype)
        if self._decays[index]:
            direction = direction + ops.cast(self.weight_decay_rate, dtype) * variable
        return direction

    def _finish(self, variable, index, direction, squares, learning_rate):
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        if squares is None:
            trust = ops.ones((), dtype)
        else:
            trust = self._trust_ratio(ops.sqrt(squares[0]), ops.sqrt(squares[1]), dtype)
        self.assign(self._trust_ratio_variables[index], ops.cast(trust, "float32"))
        step = lr * trust * direction
        velocity = self.momentums[index]
        if velocity is None:
            self.assign_sub(variable, step)
            return
        momentum = ops.cast(self.momentum, dtype)
        self.assign(velocity, momentum * velocity + step)
        if self.nesterov:
            self.assign_sub(variable, momentum * velocity + step)
        else:
            self.assign_sub(variable, velocity)

    def _trust_ratio(self, weight_norm, direction_norm, dtype):
        both_positive = ops.logical_and(weight_norm > 0, direction_norm > 0)
        # The unselected branch must not divide by zero (0/0 would still be NaN).
        safe_norm = ops.where(both_positive, direction_norm, ops.ones((), dtype))
        ratio = (
            ops.cast(self.eeta, dtype)
            * weight_norm
            / (safe_norm + ops.cast(self.epsilon, dtype))
        )
        return ops.where(both_positive, ratio, ops.ones((), dtype))

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "weight_decay": self.weight_decay_rate,
                "eeta": self.eeta,
                "epsilon": self.epsilon,
                "nesterov": self.nesterov,
                "exclude_from_weight_decay": list(self._weight_decay_exclusions),
                "exclude_from_layer_adaptation": list(self._adaptation_exclusions),
            }
        )
        return config


def _squares(variable, direction):
    """`[sum(w**2), sum(d**2)]`: what the trust ratio's two norms are made of."""
    return ops.stack([ops.sum(ops.square(variable)), ops.sum(ops.square(direction))])


def _dense(gradient):
    # The trust ratio needs the norm of the whole gradient. An Embedding's gradient is
    # an IndexedSlices whose rows may repeat, so the norm of its values would be wrong.
    if isinstance(gradient, tf.IndexedSlices):
        return tf.convert_to_tensor(gradient)
    return gradient


def _check_patterns(name: str, patterns) -> tuple[str, ...]:
    if isinstance(patterns, str) or not isinstance(patterns, Sequence):
        raise TypeError(
            f"`{name}` must be a list of regular expressions. Received: "
            f"{name}={patterns!r}. Wrap a single pattern in a list, e.g. "
            f"{name}=[{patterns!r}], or pass [] to exclude nothing."
        )
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise TypeError(
                f"`{name}` must contain only strings. Received: {name}={patterns!r} "
                f"with {pattern!r} (of type {type(pattern).__name__})."
            )
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(
                f"`{name}` holds an invalid regular expression. Received: "
                f"{pattern!r} ({error}). Escape special characters with re.escape()."
            ) from error
    return tuple(patterns)


def _compile(patterns: tuple[str, ...]):
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None


def _matches(compiled, path: str) -> bool:
    return compiled is not None and compiled.search(path) is not None


def _path(variable) -> str:
    return getattr(variable, "path", None) or variable.name
