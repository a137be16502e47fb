"""The numerical pieces of `Neumann`'s update that are not one line (see
`neumann.py`): the regularizer coefficient and the moves between true and displaced
weights."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf


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


def undisplace(variable, iterate, mu):
    return variable.assign(variable - tf.cast(mu, variable.dtype) * iterate)


def displace(variable, iterate, mu):
    # The same association as the in-step re-displacement (`w + mu * m`).
    return variable.assign(variable + tf.cast(mu, variable.dtype) * iterate)
