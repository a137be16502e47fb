"""Learning rate schedules for large-batch training (Goyal et al. 2017).

`Warmup` puts a gradual warmup in front of any Keras schedule,
`PolynomialDecayWithWarmup` is the MLPerf ResNet-50 LARS schedule, and
`scaled_learning_rate` applies the linear scaling rule.
"""

from keras_replicator.schedules.linear_scaling import scaled_learning_rate
from keras_replicator.schedules.polynomial_decay_with_warmup import (
    PolynomialDecayWithWarmup,
)
from keras_replicator.schedules.warmup import Warmup

__all__ = ["PolynomialDecayWithWarmup", "Warmup", "scaled_learning_rate"]
