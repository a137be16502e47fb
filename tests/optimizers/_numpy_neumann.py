"""Neumann's Algorithm 2 (Krishnan et al. 2017) in NumPy float64, from the paper.

Written from the class docstring's pseudo-code, independently of the TensorFlow
code, so the tests compare two transcriptions.
"""

from __future__ import annotations

import math

import numpy as np


class NumpyNeumann:
    def __init__(
        self,
        weights,
        *,
        lr,
        alpha=1e-7,
        beta=1e-5,
        gamma=0.99,
        mu_min=0.5,
        mu_max=0.9,
        reset_steps=1000,
        reset_growth=2.0,
        burn_in_steps=0,
        mu_steps=100.0,
        regularizer_norm="variable",
        reset_mode="zero",
        mu_since_reset=False,
    ):
        self.w = [np.array(x, np.float64) for x in weights]
        self.m = [np.zeros_like(x) for x in self.w]
        self.v = [np.zeros_like(x) for x in self.w]
        self.lr, self.alpha, self.beta, self.gamma = lr, alpha, beta, gamma
        self.mu_min, self.mu_max = mu_min, mu_max
        self.reset_steps, self.reset_growth = reset_steps, reset_growth
        self.burn_in_steps, self.mu_steps = burn_in_steps, mu_steps
        self.norm, self.reset_mode = regularizer_norm, reset_mode
        self.mu_since_reset = mu_since_reset
        self.step = 0
        self.mu = 0.0
        self.next_reset = 0
        self.period = float(reset_steps or 0)
        self.last_reset = 0
        self.resets = []  # the t of each reset, for the tests

    def apply(self, grads):
        grads = [np.array(g, np.float64) for g in grads]
        lr = self.lr(self.step) if callable(self.lr) else self.lr
        if self.step < self.burn_in_steps:
            self.w = [w - lr * g for w, g in zip(self.w, grads)]
            self.step += 1
            return
        t = self.step - self.burn_in_steps
        if t == 0:
            self.v = [w.copy() for w in self.w]
        if self.reset_steps is not None and t >= self.next_reset:
            self.resets.append(t)
            self.next_reset += max(1, math.floor(self.period))
            self.period *= self.reset_growth
            self.last_reset = t
            if self.reset_mode == "zero":
                self.m = [np.zeros_like(m) for m in self.m]
            else:
                self.m = [-lr * g for g in grads]
        schedule_t = t - self.last_reset if self.mu_since_reset else t
        mu = 1.0 - 1.0 / (1.0 + schedule_t / self.mu_steps)
        mu = min(max(mu, self.mu_min), self.mu_max)
        r = [w - v for w, v in zip(self.w, self.v)]
        squares = [np.sum(x * x) for x in r]
        sizes = [float(x.size) for x in r]
        if self.norm == "global":
            squares = [sum(squares)] * len(r)
            sizes = [math.fsum(sizes)] * len(r)
        for i, g in enumerate(grads):
            if squares[i] > 0:
                rho = math.sqrt(squares[i])
                coefficient = self.alpha * rho - self.beta * sizes[i] / rho**3
            else:
                coefficient = 0.0
            d = g + coefficient * r[i]
            self.m[i] = mu * self.m[i] - lr * d
            self.w[i] = self.w[i] + (mu * self.m[i] - lr * d)
            self.v[i] = self.w[i] + self.gamma * (self.v[i] - self.w[i])
        self.mu = mu
        self.step += 1

    def true_weights(self):
        return [w - self.mu * m for w, m in zip(self.w, self.m)]
