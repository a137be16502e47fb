"""NLCG (Adya et al. 2018) in NumPy float64, with the authors' timing at hand.

The step control follows apple/ml-ncg (`ncg_core_tfop.py`) as its TF1 graph
executes when the loss is ready before the gradient (as in training) when
`reverted=""`: the multiplier, the loss average and the stored direction are
read before the step's own assignments. So a check compares the average before
this step's loss; a new multiplier applies from the next update; a take-back is
blended at the new rate and applied at the old one; the stored direction is the
unblended `d`; the BFGS `s` is this update's rate times the stored direction.
With the authors' epsilons (`authors_epsilons=True`) that transcription matched
their graph, run in `tf.compat.v1` on fed gradients and losses, to float32
rounding (5 settings, 40 steps). `reverted` names the parts (letters of
`_nlcg_steps.AUTHORS_TIMING`) taken from before commit 1e9b5d4; the default
`"ab"` and our epsilons are the library's defaults (see `nlcg.py`).

Variables are concatenated into one vector, so every dot product is global by
construction (the TensorFlow code sums per-variable products instead).
"""

from __future__ import annotations

import math

import numpy as np

DEFAULT_REVERTED = "ab"  # the library's `_nlcg_steps.AUTHORS_TIMING` (tested)
BANDS = (
    (0.15, 0.5, 0.9),
    (0.125, 0.7, 0.7),
    (0.10, 0.8, 0.5),
    (0.075, 0.9, 0.3),
    (0.05, 0.95, 0.2),
    (0.025, 0.975, 0.1),
    (0.01, 1.0, 0.1),
)


class NumpyNLCG:
    def __init__(
        self,
        weights,
        *,
        lr,
        beta_rule="fr",
        preconditioner="diag_bfgs",
        step_control=True,
        lars_eta=None,
        period=5,
        threshold=1.0,
        smoothing=0.7,
        eps=1e-8,
        authors_epsilons=False,
        reverted=DEFAULT_REVERTED,
    ):
        self.shapes = [np.shape(x) for x in weights]
        self.w = self._flat(weights)
        self.lr, self.rule, self.precond = lr, beta_rule, preconditioner
        self.step_control, self.lars_eta = step_control, lars_eta
        self.period, self.threshold, self.smoothing, self.eps = (
            period,
            threshold,
            smoothing,
            eps,
        )
        n = self.w.size
        self.d = np.zeros(n)
        self.g_prev = np.zeros(n)
        self.z_prev = np.zeros(n)
        self.b = np.ones(n)
        self.rz = 0.0
        self.c = 1.0
        self.ema = self.ema_old = 0.0
        self.step = 0
        self.bands = []  # (step, band index or "grow") of each check, for the tests
        self.scales = []  # lr * c of each update, for the tests
        self.bfgs_updates = self.bfgs_skips = 0
        self.authors_epsilons = authors_epsilons
        # The parts of the step-control timing taken from before 1e9b5d4 (see
        # `_nlcg_steps.AUTHORS_TIMING`): "" is the authors' code throughout.
        self.timing = {k: k not in reverted for k in "abcde"}
        self.prev_scale = 0.0

    @staticmethod
    def _flat(arrays):
        return np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in arrays])

    def weights(self):
        out, start = [], 0
        for shape in self.shapes:
            size = int(np.prod(shape))
            out.append(self.w[start : start + size].reshape(shape))
            start += size
        return out

    def apply(self, grads, loss=None):
        lr = self.lr(self.step) if callable(self.lr) else self.lr
        if self.lars_eta is not None:
            scaled, ws = [], self.weights()
            for g, w in zip(grads, ws):
                g = np.asarray(g, np.float64)
                wn, gn = np.linalg.norm(w), np.linalg.norm(g)
                trust = self.lars_eta * wn / gn if wn > 0 and gn > 0 else 1.0
                scaled.append(trust * g)
            grads = scaled
        g = self._flat(grads)
        first = self.step == 0
        eps, theirs = self.eps, self.authors_epsilons
        scale = lr * self.c  # read before this step's control changes `c`
        t = self.timing
        r = -g
        if self.precond == "diag_bfgs":
            if first:
                self.b = np.ones_like(g)
            else:
                s = (scale if t["e"] else self.prev_scale) * self.d
                y = g - self.g_prev
                ys, bs = y @ s, self.b * s
                sbs = s @ bs
                if theirs and not (ys < eps or sbs < eps):
                    self.b = np.abs(
                        self.b - (bs**2 + eps) / (sbs + eps) + (y**2 + eps) / (ys + eps)
                    )
                    self.bfgs_updates += 1
                elif not theirs and ys > eps and sbs > eps:
                    self.b = np.abs(self.b - bs**2 / sbs + y**2 / ys)
                    self.bfgs_updates += 1
                else:
                    self.bfgs_skips += 1
            z = r if theirs and first else r / (self.b + eps)
            self.g_prev = g
        else:
            z = r
        rz = r @ z
        if first:
            beta = 0.0
        else:
            numerator = rz - r @ self.z_prev if self.rule == "pr" else rz
            if theirs:
                beta = min(max(numerator / (self.rz + eps), 0.0), 1.0)
            else:
                beta = 0.0 if self.rz <= 0 else min(max(numerator / self.rz, 0.0), 1.0)
        d = z + beta * self.d
        applied, update, stored = scale, scale * d, d
        if self.step_control:
            ema_before = self.ema
            if first:
                self.ema = self.ema_old = loss
            else:
                self.ema = self.smoothing * self.ema + (1 - self.smoothing) * loss
            if not first and self.step % self.period == 0:
                current = ema_before if t["a"] else self.ema
                rise = (
                    (current - self.ema_old) / abs(self.ema_old)
                    if self.ema_old != 0
                    else 0.0
                )
                self.ema_old = self.ema
                share = 0.0
                if rise < BANDS[-1][0] * self.threshold:
                    self.c = min(self.c * 1.05, 1.0)
                    self.bands.append((self.step, "grow"))
                else:
                    factor, band = 1.0, "edge"
                    for index, (above, f, p) in enumerate(BANDS):
                        if rise > above * self.threshold:
                            factor, share, band = f, p, index
                            break
                    self.c = max(self.c * factor, 1e-4)
                    self.bands.append((self.step, band))
                new_scale = lr * self.c
                if not t["b"]:  # the new `c` applies to this update already
                    applied, update = new_scale, new_scale * d
                if share > 0 and t["c"] and new_scale > 0:
                    # Blended at the new rate, applied at `applied`.
                    blend = (1 - share) * new_scale * d - share * scale * self.d
                    update = applied * (blend / new_scale)
                elif share > 0 and not t["c"]:  # a share of the previous update
                    previous = self.prev_scale * self.d
                    update = (1 - share) * applied * d - share * previous
                if share > 0 and not t["d"] and applied > 0:
                    stored = update / applied  # the direction actually applied
        self.w = self.w + update
        self.d, self.z_prev, self.rz = stored, z, rz
        self.prev_scale = applied
        self.scales.append(applied)
        self.step += 1
        return math.nan if loss is None else loss
