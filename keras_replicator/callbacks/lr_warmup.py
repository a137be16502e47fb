"""`LearningRateWarmup`: gradual warmup for a model compiled with a fixed learning rate.

For users who keep a float learning rate in `compile` (Horovod's
`LearningRateWarmupCallback` style). With a schedule, prefer
`keras_replicator.schedules.Warmup`, which lives inside the optimizer and survives
`model.save`.

Goyal et al.'s momentum correction cannot be done by changing `optimizer.momentum` as
Horovod does: Keras 3 reads that float when it traces the train function, so later
changes are ignored. Rescaling the velocity by `new_lr / old_lr` before the step is
the same correction (`v <- m * (new / old) * v + new * g`) and works on the compiled
function, for optimizers whose velocity includes the learning rate (SGD, LARS).
"""

from __future__ import annotations

import numbers

import keras


class LearningRateWarmup(keras.callbacks.Callback):
    """Ramps the learning rate linearly up to the compiled one over the first epochs.

    Large-batch training with the linear scaling rule (see
    `keras_replicator.scaled_learning_rate`) diverges in the first epochs, when the
    weights change fastest. Goyal et al. (2017) warm up: start from a small learning
    rate and add a constant amount every step until the target is reached after 5
    epochs; with that ResNet-50 trains at batch 8k as well as at 256.

    The target is the optimizer's learning rate when training starts (the float passed
    to `compile`) unless `target_learning_rate` is given. At step `s` (counted from
    epoch 0, so `fit(initial_epoch=...)` resumes the ramp where it was) the learning
    rate is `start + (target - start) * s / warmup_steps`; from `warmup_steps` on it
    is the target, and the callback stops touching it, so it can be followed by
    `keras.callbacks.LearningRateScheduler` or `ReduceLROnPlateau`.

    Args:
        warmup_epochs: Float > 0, the length of the warmup in epochs (fractions
            allowed). Defaults to `5` (Goyal et al.).
        start_learning_rate: Float >= 0, the learning rate at the first step.
            Defaults to `0.0`. Goyal et al. start at the small-batch learning rate
            (the target divided by the batch-size multiple).
        target_learning_rate: Float > 0, the learning rate to reach. Defaults to
            `None`: the optimizer's learning rate when training starts. Pass it when
            resuming from a checkpoint written during warmup, whose optimizer holds a
            warmup value.
        steps_per_epoch: Int > 0, steps in one epoch. Defaults to `None`: what `fit`
            reports; required when `fit` cannot know it (a dataset of unknown size
            with no `steps_per_epoch`).
        momentum_correction: Whether to rescale the optimizer's velocity by
            `new_lr / old_lr` whenever the learning rate changes (Goyal et al. §2.1).
            Only for `keras.optimizers.SGD` (with momentum) and
            `keras_replicator.optimizers.LARS`, whose velocity includes the learning
            rate. Defaults to `False`: with a gradual warmup the per-step change is
            small.
        verbose: 0 (quiet) or 1 (print when warmup starts and ends). Defaults to `0`.

    Raises:
        ValueError: If an argument is out of range. At the start of training: if the
            optimizer has a learning rate schedule, if the number of steps per epoch
            is unknown, or if `momentum_correction=True` with another optimizer.

    Example:
    >>> import keras, numpy as np
    >>> from keras_replicator.callbacks import LearningRateWarmup
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras.optimizers.SGD(0.8, momentum=0.9), loss="mse")
    >>> warmup = LearningRateWarmup(warmup_epochs=2)
    >>> history = model.fit(np.ones((64, 4)), np.zeros(64), batch_size=16,
    ...                     epochs=3, callbacks=[warmup], verbose=0)
    >>> [round(lr, 4) for lr in history.history["learning_rate"]]
    [0.3, 0.7, 0.8]

    References:
        - [Goyal et al., 2017. Accurate, Large Minibatch SGD: Training ImageNet in
          1 Hour](https://arxiv.org/abs/1706.02677)
    """

    def __init__(
        self,
        warmup_epochs: float = 5,
        start_learning_rate: float = 0.0,
        target_learning_rate: float | None = None,
        steps_per_epoch: int | None = None,
        momentum_correction: bool = False,
        verbose: int = 0,
    ):
        super().__init__()
        if not _is_number(warmup_epochs) or not warmup_epochs > 0:
            raise ValueError(
                "`warmup_epochs` must be a number > 0. Received: "
                f"warmup_epochs={warmup_epochs!r}. Drop the callback for no warmup."
            )
        if not _is_number(start_learning_rate) or start_learning_rate < 0:
            raise ValueError(
                "`start_learning_rate` must be a number >= 0. Received: "
                f"start_learning_rate={start_learning_rate!r}."
            )
        if target_learning_rate is not None and (
            not _is_number(target_learning_rate) or not target_learning_rate > 0
        ):
            raise ValueError(
                "`target_learning_rate` must be a number > 0 or None. Received: "
                f"target_learning_rate={target_learning_rate!r}."
            )
        if steps_per_epoch is not None and (
            not isinstance(steps_per_epoch, numbers.Integral)
            or isinstance(steps_per_epoch, bool)
            or steps_per_epoch <= 0
        ):
            raise ValueError(
                "`steps_per_epoch` must be an int > 0 or None. Received: "
                f"steps_per_epoch={steps_per_epoch!r}."
            )
        self.warmup_epochs = float(warmup_epochs)
        self.start_learning_rate = float(start_learning_rate)
        self.steps_per_epoch = steps_per_epoch
        self.momentum_correction = bool(momentum_correction)
        self.verbose = verbose
        self.target_learning_rate = (
            None if target_learning_rate is None else float(target_learning_rate)
        )
        self._epoch = 0
        self._steps_per_epoch = None
        self._warmup_steps = None
        self._done = False

    def on_train_begin(self, logs=None):
        optimizer = _inner(self.model.optimizer)
        # A float learning rate is a variable; a schedule or callable gives a value.
        if not isinstance(optimizer.learning_rate, keras.Variable):
            raise ValueError(
                "`LearningRateWarmup` needs a float learning rate in `compile`, but "
                f"the optimizer's learning rate is {optimizer.learning_rate!r}. Wrap "
                "the schedule in keras_replicator.schedules.Warmup instead."
            )
        if self.momentum_correction:
            _check_velocity_form(optimizer)
        steps = self.steps_per_epoch or (self.params or {}).get("steps")
        if not steps:
            raise ValueError(
                "`LearningRateWarmup` cannot tell how many steps an epoch has: `fit` "
                "did not report it (a dataset of unknown size?). Pass "
                "`steps_per_epoch` to the callback (or to `fit`)."
            )
        self._steps_per_epoch = int(steps)
        self._warmup_steps = max(1, round(self.warmup_epochs * self._steps_per_epoch))
        if self.target_learning_rate is None:
            # Read once: a second `fit` must not take a warmup value for the target.
            self.target_learning_rate = _read(optimizer.learning_rate)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self._done:
            return
        step = self._epoch * self._steps_per_epoch + batch
        optimizer = _inner(self.model.optimizer)
        new = self.learning_rate_at(step)
        if self.momentum_correction:
            old = _read(optimizer.learning_rate)
            if old > 0 and new != old:
                for velocity in getattr(optimizer, "momentums", None) or ():
                    if velocity is not None:
                        velocity.assign(velocity * (new / old))
        optimizer.learning_rate = new
        if step == 0 and self.verbose:
            print(
                f"LearningRateWarmup: from {new:.6g} to {self.target_learning_rate:.6g}"
                f" over {self._warmup_steps} steps."
            )
        if step >= self._warmup_steps:
            self._done = True
            if self.verbose:
                print(f"\nLearningRateWarmup: reached {new:.6g} at step {step}.")

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = _read(_inner(self.model.optimizer).learning_rate)

    def learning_rate_at(self, step: int) -> float:
        """The learning rate this callback sets before optimizer step `step`."""
        if self.target_learning_rate is None or self._warmup_steps is None:
            raise RuntimeError(
                "`learning_rate_at()` is known once training has started "
                "(`on_train_begin` reads the target and the steps per epoch)."
            )
        target = self.target_learning_rate
        start = self.start_learning_rate
        fraction = min(1.0, step / self._warmup_steps)
        return start + (target - start) * fraction


def _inner(optimizer):
    # LossScaleOptimizer forwards `learning_rate` but keeps the velocity inside.
    return getattr(optimizer, "inner_optimizer", optimizer)


def _check_velocity_form(optimizer) -> None:
    from keras_replicator.optimizers import LARS

    is_sgd = isinstance(optimizer, keras.optimizers.SGD) and optimizer.momentum > 0
    if not (is_sgd or isinstance(optimizer, LARS)):
        raise ValueError(
            "`momentum_correction=True` needs an optimizer whose velocity includes "
            "the learning rate: keras.optimizers.SGD with momentum > 0 or "
            "keras_replicator.optimizers.LARS. Received: optimizer="
            f"{type(optimizer).__name__}. Pass momentum_correction=False."
        )


def _read(value) -> float:
    return float(keras.ops.convert_to_numpy(value))


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
