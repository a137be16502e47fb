"""`TrustRatioLogger`: shows what LARS does, layer by layer, in the training logs.

LARS fails quietly: a trust coefficient that is too small freezes layers, one that is
too large makes them diverge, and the loss alone does not say which layer. The trust
ratio each variable got (kept by `LARS` in optimizer variables) and the effective
learning rate `lr * trust` are the numbers to look at. Putting them into `logs` lets
Keras' own loggers (`History`, `CSVLogger`, `TensorBoard`) record them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, cast

import keras
import numpy as np

_STATISTICS: dict[str, Callable[[np.ndarray], Any]] = {
    "mean": np.mean,
    "min": np.min,
    "max": np.max,
}


class TrustRatioLogger(keras.callbacks.Callback):
    """Adds LARS trust-ratio statistics per layer group to the epoch (or batch) logs.

    For each group of variables the callback logs `"<prefix>/<group>/<statistic>"`,
    e.g. `"trust_ratio/dense/mean"`, computed over the trust ratios the variables got
    at the last step. With `effective_learning_rate=True` it also logs the mean
    `learning_rate * trust_ratio` of each group as `"<prefix>/<group>/effective_lr"`.
    Only variables LARS adapts are included (excluded ones have a ratio of 1).

    Args:
        groups: How to group variables. `"layer"`: one group per layer (the variable
            path without its last part, e.g. `"sequential/dense"`). `"variable"`: one
            group per variable. `"all"`: one group, named `"all"`. A dict
            `{group name: regular expression}`: the variables whose path the
            expression matches (`re.search`); a variable may be in several groups.
            Defaults to `"layer"`.
        statistics: Which statistics to log per group, from `"mean"`, `"min"` and
            `"max"`. Defaults to `("mean",)`.
        effective_learning_rate: Whether to log `lr * trust_ratio` too. Defaults to
            `False`.
        update_freq: `"epoch"`, or an int `n` to also add the values to the batch
            logs every `n` batches (this reads the optimizer variables, a small
            device-to-host copy). Defaults to `"epoch"`.
        prefix: Prefix of the log keys. Defaults to `"trust_ratio"`.

    Raises:
        ValueError: If an argument is invalid, or (when training starts) if the
            model's optimizer is not `keras_replicator.optimizers.LARS` (or a
            `LossScaleOptimizer` around one), or a group matches no variable.

    Example:
    >>> import keras, numpy as np
    >>> from keras_replicator.optimizers import LARS
    >>> from keras_replicator.callbacks import TrustRatioLogger
    >>> model = keras.Sequential(
    ...     [keras.Input((4,)), keras.layers.Dense(2, name="dense")], name="model")
    >>> model.compile(LARS(learning_rate=1.0), loss="mse")
    >>> history = model.fit(np.ones((8, 4)), np.zeros((8, 2)), epochs=2, verbose=0,
    ...                     callbacks=[TrustRatioLogger()])
    >>> [key for key in history.history if key.startswith("trust_ratio")]
    ['trust_ratio/model/dense/mean']

    References:
        - [You et al., 2017. Large Batch Training of Convolutional Networks](
          https://arxiv.org/abs/1708.03888)
    """

    def __init__(
        self,
        groups: str | Mapping[str, str] = "layer",
        statistics: tuple[str, ...] | list[str] = ("mean",),
        effective_learning_rate: bool = False,
        update_freq: str | int = "epoch",
        prefix: str = "trust_ratio",
    ):
        super().__init__()
        if isinstance(groups, Mapping):
            for name, pattern in groups.items():
                try:
                    re.compile(pattern)
                except (re.error, TypeError) as error:
                    raise ValueError(
                        f"`groups` maps {name!r} to an invalid regular expression. "
                        f"Received: {pattern!r} ({error})."
                    ) from error
        elif groups not in ("layer", "variable", "all"):
            raise ValueError(
                '`groups` must be "layer", "variable", "all" or a dict of group name '
                f"to regular expression. Received: groups={groups!r}."
            )
        if isinstance(statistics, str):
            statistics = (statistics,)
        unknown = [s for s in statistics if s not in _STATISTICS]
        if unknown or not statistics:
            raise ValueError(
                f"`statistics` must be a non-empty list of {sorted(_STATISTICS)}. "
                f"Received: statistics={statistics!r}."
            )
        if update_freq != "epoch" and (
            not isinstance(update_freq, int)
            or isinstance(update_freq, bool)
            or update_freq <= 0
        ):
            raise ValueError(
                '`update_freq` must be "epoch" or an int > 0. Received: '
                f"update_freq={update_freq!r}."
            )
        self.groups = dict(groups) if isinstance(groups, Mapping) else groups
        self.statistics = tuple(statistics)
        self.effective_learning_rate = bool(effective_learning_rate)
        self.update_freq = update_freq
        self.prefix = prefix
        self._members: dict[str, list[str]] | None = None

    def on_train_begin(self, logs=None):
        from keras_replicator.optimizers import LARS

        optimizer = getattr(self.model.optimizer, "inner_optimizer", None)
        optimizer = optimizer or self.model.optimizer
        if not isinstance(optimizer, LARS):
            raise ValueError(
                "`TrustRatioLogger` reads the trust ratios of "
                "keras_replicator.optimizers.LARS. Received: optimizer="
                f"{type(optimizer).__name__}. Compile the model with LARS, or drop "
                "the callback."
            )
        self._optimizer = optimizer
        self._members = None
        if optimizer.built:  # e.g. a second `fit`; otherwise after the first step
            self._members = self._group(optimizer.adapted_paths())

    def on_train_batch_end(self, batch, logs=None):
        if self._members is None and self._optimizer.built:
            self._members = self._group(self._optimizer.adapted_paths())  # fail early
        if self.update_freq != "epoch" and logs is not None:
            if (batch + 1) % self.update_freq == 0:
                logs.update(self.statistics_now())

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self.statistics_now())

    def statistics_now(self) -> dict[str, float]:
        """The log entries for the optimizer's current trust ratios."""
        ratios = self._optimizer.trust_ratios
        if not ratios:
            return {}
        if self._members is None:
            self._members = self._group(self._optimizer.adapted_paths())
        values = {
            path: float(keras.ops.convert_to_numpy(ratios[path]))
            for path in {p for paths in self._members.values() for p in paths}
        }
        learning_rate = None
        if self.effective_learning_rate:
            learning_rate = float(
                keras.ops.convert_to_numpy(self._optimizer.learning_rate)
            )
        entries = {}
        for group, paths in self._members.items():
            group_values = np.array([values[path] for path in paths])
            for statistic in self.statistics:
                entries[f"{self.prefix}/{group}/{statistic}"] = float(
                    _STATISTICS[statistic](group_values)
                )
            if learning_rate is not None:
                entries[f"{self.prefix}/{group}/effective_lr"] = float(
                    learning_rate * group_values.mean()
                )
        return entries

    def _group(self, paths: list[str]) -> dict[str, list[str]]:
        if self.groups == "all":
            return {"all": list(paths)} if paths else {}
        if self.groups == "variable":
            return {path: [path] for path in paths}
        if self.groups == "layer":
            members: dict[str, list[str]] = {}
            for path in paths:
                members.setdefault(path.rpartition("/")[0] or path, []).append(path)
            return members
        members = {}
        patterns = cast(dict[str, str], self.groups)  # not one of the names above
        for name, pattern in patterns.items():
            matched = [path for path in paths if re.search(pattern, path)]
            if not matched:
                raise ValueError(
                    f"`groups` entry {name!r}: {pattern!r} matches no variable that "
                    f"LARS adapts. Adapted variables: {paths}."
                )
            members[name] = matched
        return members
