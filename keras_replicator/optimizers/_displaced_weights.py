"""`Neumann`'s two sets of weights: the displaced ones it trains, the true ones.

Algorithm 2 of Krishnan et al. stores `w + mu * m` (the point where the next
gradient is taken), so the model holds *displaced* weights during training; the
true weights are `w - mu * m`. This module is that concept alone: reading the
true weights, moving the model between the two in place (one rounding per
element, no extra copy), and ending `fit` on the true weights. Moving back inside
`fit` (the `UseTrueWeights` callback) is `use_true_weights.py`; the update
itself is `neumann.py`.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from keras_replicator import _compat
from keras_replicator.optimizers._whole_list import _raw


class DisplacedWeights:
    """The displaced / true weights API of `Neumann` (a mixin).

    Uses the state `Neumann.build` creates: `_iterates` (`m` per variable), `_mu`
    (the last momentum) and `_displaced` (1.0 while the model holds `w + mu * m`,
    a saved flag).
    """

    @property
    def displaced(self) -> bool:
        """Whether the model holds the displaced weights `w + mu * m` right now."""
        return self.built and float(self._displaced.numpy()) != 0.0

    @property
    def current_mu(self) -> float:
        """The momentum `mu` of the last update (0 before the first one)."""
        return float(self._mu.numpy()) if self.built else 0.0

    def true_weights(self, var_list=None) -> list[np.ndarray]:
        """The true weights `w - mu * m` as NumPy arrays; nothing is changed.

        Args:
            var_list: Variables to read (a subset of those the optimizer was built
                with). Defaults to `None`: all of them.
        """
        pairs = self._pairs(var_list)
        mu = float(self._mu.numpy()) if self.displaced else 0.0
        result = []
        for variable, iterate in pairs:
            value = keras.ops.convert_to_numpy(variable)
            if iterate is not None and mu:
                value = value - np.asarray(
                    mu, value.dtype
                ) * keras.ops.convert_to_numpy(iterate)
            result.append(value)
        return result

    def use_true_weights(self) -> None:
        """Moves the model to the true weights in place (no-op if already there).

        Call it in the cross-replica context (outside `strategy.run`), e.g. before
        evaluating or saving. The next gradient must be taken at the displaced
        weights: in `fit`, the `UseTrueWeights` callback moves back before each
        epoch; a custom loop calls `use_displaced_weights()` (otherwise the next
        update fails: its gradient was taken at the true weights).
        """
        self._move(to_true=True)

    def use_displaced_weights(self) -> None:
        """Moves the model back to the displaced weights `w + mu * m` (no-op if
        already there): exactly where training stood, up to one rounding."""
        self._move(to_true=False)

    def _move(self, to_true: bool) -> None:
        if not self.built or self.displaced != to_true:
            return
        strategy = _compat.optimizer.optimizer_strategy(self)
        with strategy.scope():
            for variable, iterate in self._pairs(None):
                if iterate is None:
                    continue
                strategy.extended.update(
                    _raw(variable),
                    _undisplace if to_true else _displace,
                    args=(_raw(iterate), _raw(self._mu)),
                    group=False,
                )
            self._displaced.assign(0.0 if to_true else 1.0)

    def finalize_variable_values(self, var_list):
        """Ends training (Keras' `fit` calls it) with the true weights."""
        self.use_true_weights()
        super().finalize_variable_values(var_list)

    def _pairs(self, var_list):
        if not self.built:
            raise ValueError(
                "The optimizer is not built yet: there are no weights to read. "
                "Call `optimizer.build(model.trainable_variables)` or train first."
            )
        if var_list is None:
            var_list = _compat.optimizer.trainable_variables_of(self)
        index = [_compat.optimizer_variable_index(self, v) for v in var_list]
        return [(v, self._iterates[i]) for v, i in zip(var_list, index)]


def _undisplace(variable, iterate, mu):
    return variable.assign(variable - tf.cast(mu, variable.dtype) * iterate)


def _displace(variable, iterate, mu):
    # The same association as the in-step re-displacement (`w + mu * m`).
    return variable.assign(variable + tf.cast(mu, variable.dtype) * iterate)
