"""`PolynomialDecayWithWarmup`: the MLPerf ResNet-50 LARS schedule, named.

It is Keras' own `PolynomialDecay` behind our `Warmup`; the class exists so that the
recipe has one name, one set of defaults and a readable config.
"""

from __future__ import annotations

import numbers

import keras

from keras_replicator.schedules.warmup import Warmup, _is_number


@keras.saving.register_keras_serializable(package="keras_replicator")
class PolynomialDecayWithWarmup(Warmup):
    """Linear warmup to `peak_learning_rate`, then polynomial decay (power 2).

    This is the schedule of the MLPerf ResNet-50 LARS submissions (You et al. 2017 use
    the same polynomial decay): a linear ramp over `warmup_steps`, then

    ```python
    (peak - end) * (1 - (step - warmup_steps) / decay_steps) ** power + end
    ```

    for `decay_steps` more steps, and `end_learning_rate` after that.

    Args:
        peak_learning_rate: Float, the learning rate when warmup ends (scale it with
            `keras_replicator.scaled_learning_rate`).
        warmup_steps: Int >= 0, steps of linear warmup.
        decay_steps: Int > 0, steps of decay after warmup; the schedule spans
            `warmup_steps + decay_steps` steps.
        end_learning_rate: Float, the final learning rate. Defaults to `0.0001`
            (Keras' `PolynomialDecay` and MLPerf).
        power: Float, the power of the decay. Defaults to `2.0` (MLPerf).
        start_learning_rate: Float, the learning rate at step 0. Defaults to `0.0`.
        name: Name of the schedule. Defaults to `"PolynomialDecayWithWarmup"`.

    Raises:
        ValueError: If `decay_steps` or `warmup_steps` is out of range.

    Example:
    >>> from keras_replicator.schedules import PolynomialDecayWithWarmup
    >>> schedule = PolynomialDecayWithWarmup(
    ...     peak_learning_rate=2.0, warmup_steps=10, decay_steps=100,
    ...     end_learning_rate=0.0)
    >>> [round(float(schedule(step)), 4) for step in (0, 5, 10, 60, 110, 200)]
    [0.0, 1.0, 2.0, 0.5, 0.0, 0.0]

    References:
        - [You et al., 2017. Large Batch Training of Convolutional Networks](
          https://arxiv.org/abs/1708.03888)
        - [Goyal et al., 2017. Accurate, Large Minibatch SGD: Training ImageNet in
          1 Hour](https://arxiv.org/abs/1706.02677)
    """

    peak_learning_rate: float
    decay_steps: int
    end_learning_rate: float
    power: float

    def __init__(
        self,
        peak_learning_rate: float,
        warmup_steps: int,
        decay_steps: int,
        end_learning_rate: float = 0.0001,
        power: float = 2.0,
        start_learning_rate: float = 0.0,
        name: str = "PolynomialDecayWithWarmup",
    ) -> None:
        if not _is_number(peak_learning_rate) or peak_learning_rate <= 0:
            raise ValueError(
                "`peak_learning_rate` must be a float > 0. Received: "
                f"peak_learning_rate={peak_learning_rate!r}."
            )
        if not isinstance(decay_steps, numbers.Integral) or isinstance(
            decay_steps, bool
        ):
            raise TypeError(
                f"`decay_steps` must be an int. Received: decay_steps={decay_steps!r}."
                " Pass the number of steps after warmup, e.g. "
                "total_steps - warmup_steps."
            )
        if decay_steps <= 0:
            raise ValueError(
                f"`decay_steps` must be > 0. Received: decay_steps={decay_steps}. "
                "Pass the number of steps after warmup, e.g. "
                "total_steps - warmup_steps."
            )
        decay = keras.optimizers.schedules.PolynomialDecay(
            initial_learning_rate=float(peak_learning_rate),
            decay_steps=int(decay_steps),
            end_learning_rate=end_learning_rate,
            power=power,
        )
        super().__init__(
            decay,
            warmup_steps,
            start_learning_rate=start_learning_rate,
            delay_schedule=True,
            name=name,
        )
        self.peak_learning_rate = peak_learning_rate
        self.decay_steps = int(decay_steps)
        self.end_learning_rate = end_learning_rate
        self.power = power

    def get_config(self) -> dict:
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "end_learning_rate": self.end_learning_rate,
            "power": self.power,
            "start_learning_rate": self.start_learning_rate,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config: dict):
        return cls(**config)
