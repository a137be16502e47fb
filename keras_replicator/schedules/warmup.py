"""`Warmup`: a gradual warmup in front of any Keras learning rate schedule.

Keras 3 has warmup only inside `CosineDecay(warmup_target=..., warmup_steps=...)`; a
step decay (`PiecewiseConstantDecay`), an exponential or a polynomial decay cannot be
warmed up. This wrapper adds that, composing with the Keras schedules instead of
re-implementing them.
"""

from __future__ import annotations

import numbers

import keras
from keras import ops
from keras.optimizers.schedules import LearningRateSchedule


@keras.saving.register_keras_serializable(package="keras_replicator")
class Warmup(LearningRateSchedule):
    """Ramps the learning rate up over `warmup_steps`, then follows `schedule`.

    Large-batch training with the linear scaling rule diverges early, while the
    weights change fastest; Goyal et al. (2017) ramp the learning rate up gradually
    over the first 5 epochs and then train at batch 8k with no loss of accuracy.

    For `step < warmup_steps` the learning rate is

    ```python
    fraction = step / warmup_steps
    start_learning_rate + (target - start_learning_rate) * fraction**warmup_power
    ```

    where `target` is the value `schedule` has when warmup ends; afterwards it is
    `schedule(step - warmup_steps)` (`delay_schedule=True`) or `schedule(step)`.

    Args:
        schedule: The schedule after warmup: a
            `keras.optimizers.schedules.LearningRateSchedule` or a float (a constant).
        warmup_steps: Int >= 0, the number of warmup steps (optimizer iterations).
        start_learning_rate: Float, the learning rate at step 0. Defaults to `0.0`.
            Goyal et al. start at the small-batch learning rate (the target divided
            by the batch-size multiple).
        warmup_power: Float > 0, the shape of the ramp: `1.0` is linear, `2.0`
            starts slower. Defaults to `1.0`.
        delay_schedule: If `True`, `schedule` starts counting when warmup ends, as
            Keras' `CosineDecay(warmup_steps=...)` and the MLPerf polynomial decay do;
            `target` is `schedule(0)`. If `False`, `schedule` sees the global step and
            warmup replaces its first `warmup_steps` steps, as in Goyal et al., whose
            step decays at epochs 30, 60 and 80 count from the start of training;
            `target` is `schedule(warmup_steps)`. Defaults to `True`.
        name: Name of the schedule. Defaults to `"Warmup"`.

    Raises:
        TypeError: If `schedule` is neither a schedule nor a number.
        ValueError: If `warmup_steps` or `warmup_power` is out of range.

    Example:
    >>> import keras
    >>> from keras_replicator.schedules import Warmup
    >>> decay = keras.optimizers.schedules.PiecewiseConstantDecay([300], [0.4, 0.04])
    >>> schedule = Warmup(decay, warmup_steps=100, start_learning_rate=0.1,
    ...                   delay_schedule=False)
    >>> [round(float(schedule(step)), 4) for step in (0, 50, 100, 299, 301)]
    [0.1, 0.25, 0.4, 0.4, 0.04]
    >>> optimizer = keras.optimizers.SGD(schedule, momentum=0.9)

    References:
        - [Goyal et al., 2017. Accurate, Large Minibatch SGD: Training ImageNet in
          1 Hour](https://arxiv.org/abs/1706.02677)
    """

    schedule: LearningRateSchedule | float
    warmup_steps: int
    start_learning_rate: float
    warmup_power: float
    delay_schedule: bool
    name: str

    def __init__(
        self,
        schedule: LearningRateSchedule | float,
        warmup_steps: int,
        start_learning_rate: float = 0.0,
        warmup_power: float = 1.0,
        delay_schedule: bool = True,
        name: str = "Warmup",
    ) -> None:
        super().__init__()
        if _is_number(schedule):
            schedule = float(schedule)
        elif not isinstance(schedule, LearningRateSchedule):
            raise TypeError(
                "`schedule` must be a keras.optimizers.schedules.LearningRateSchedule "
                f"or a float. Received: schedule={schedule!r} (of type "
                f"{type(schedule).__name__}). Wrap a function in a "
                "LearningRateSchedule subclass, or pass a constant."
            )
        if not isinstance(warmup_steps, numbers.Integral) or isinstance(
            warmup_steps, bool
        ):
            raise TypeError(
                "`warmup_steps` must be an int. Received: "
                f"warmup_steps={warmup_steps!r}. Convert epochs to steps, e.g. "
                "warmup_steps=5 * steps_per_epoch."
            )
        if warmup_steps < 0:
            raise ValueError(
                f"`warmup_steps` must be >= 0. Received: warmup_steps={warmup_steps}."
                " Pass 0 for no warmup."
            )
        if not _is_number(start_learning_rate):
            raise TypeError(
                "`start_learning_rate` must be a float. Received: "
                f"start_learning_rate={start_learning_rate!r}."
            )
        if not _is_number(warmup_power) or warmup_power <= 0:
            raise ValueError(
                "`warmup_power` must be a float > 0. Received: "
                f"warmup_power={warmup_power!r}. Use 1.0 for a linear warmup."
            )
        self.schedule = schedule
        self.warmup_steps = int(warmup_steps)
        self.start_learning_rate = float(start_learning_rate)
        self.warmup_power = float(warmup_power)
        self.delay_schedule = bool(delay_schedule)
        self.name = name

    def __call__(self, step):
        with keras.name_scope(self.name):
            dtype = keras.backend.floatx()
            if self.delay_schedule:
                target = self._schedule_at(0, dtype)
                after = self._schedule_at(
                    ops.maximum(ops.subtract(step, self.warmup_steps), 0), dtype
                )
            else:
                target = self._schedule_at(self.warmup_steps, dtype)
                after = self._schedule_at(step, dtype)
            if self.warmup_steps == 0:
                return after
            float_step = ops.cast(step, dtype)
            fraction = ops.clip(float_step / float(self.warmup_steps), 0.0, 1.0)
            start = ops.cast(self.start_learning_rate, dtype)
            warming = start + (target - start) * ops.power(fraction, self.warmup_power)
            return ops.where(float_step < self.warmup_steps, warming, after)

    def _schedule_at(self, step, dtype):
        if isinstance(self.schedule, float):
            return ops.cast(self.schedule, dtype)
        return ops.cast(self.schedule(step), dtype)

    def get_config(self) -> dict:
        schedule = self.schedule
        if not isinstance(schedule, float):
            schedule = keras.saving.serialize_keras_object(schedule)
        return {
            "schedule": schedule,
            "warmup_steps": self.warmup_steps,
            "start_learning_rate": self.start_learning_rate,
            "warmup_power": self.warmup_power,
            "delay_schedule": self.delay_schedule,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config: dict):
        config = dict(config)
        if isinstance(config.get("schedule"), dict):
            config["schedule"] = keras.saving.deserialize_keras_object(
                config["schedule"]
            )
        return cls(**config)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
