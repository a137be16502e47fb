"""A stage: consecutive layers run as one pure function of their input and weights.

Each layer runs through Keras' public `Layer.stateless_call`, which takes the
layer's weights as tensors and returns its state updates (batch-norm moving
statistics, random-seed counters) instead of assigning them. That makes a stage's
forward pass re-runnable for re-materialization (`_checkpoint`), lets the state of
one micro-batch flow to the next in the stage (so dropout draws fresh masks per
micro-batch, as one device does across the batch), and lets the pipeline assign the
state once per mini-batch (`_batchnorm`).
"""

from __future__ import annotations

import functools
import inspect

import tensorflow as tf

from keras_replicator.pipeline import _batchnorm


class Stage:
    """The layers of one stage (the device is the caller's: one per replica)."""

    def __init__(self, layers: list):
        self.layers = layers

    @property
    def trainable_variables(self) -> list:
        return [v for layer in self.layers for v in layer.trainable_variables]

    @property
    def non_trainable_variables(self) -> list:
        return [v for layer in self.layers for v in layer.non_trainable_variables]

    def deferred_mask(self) -> list[bool]:
        """For each non-trainable variable: True if `_batchnorm` updates it."""
        return [
            _batchnorm.is_deferrable(layer)
            for layer in self.layers
            for _ in layer.non_trainable_variables
        ]

    def deferred_layers(self) -> list:
        return [layer for layer in self.layers if _batchnorm.is_deferrable(layer)]

    def run(self, x, weights: list, state: list, training: bool):
        """One micro-batch through the stage.

        Returns:
            `y, (new_state, bn_stats)`: the output, the non-trainable values after
            this micro-batch (unchanged for deferred batch norm), and the
            `(count, mean, variance)` of each deferred batch-norm layer's input.
        """
        new_state, bn_stats = [], []
        w = s = 0
        for layer in self.layers:
            nw = len(layer.trainable_variables)
            ns = len(layer.non_trainable_variables)
            layer_state = list(state[s : s + ns])
            deferred = training and _batchnorm.is_deferrable(layer)
            if deferred:
                bn_stats.append(_batchnorm.moments(layer, x))
            kwargs = {"training": training} if _takes_training(layer) else {}
            x, updated = layer.stateless_call(
                list(weights[w : w + nw]), layer_state, x, **kwargs
            )
            new_state.extend(layer_state if deferred else updated)
            w += nw
            s += ns
        return x, (new_state, bn_stats)

    def read(self, device: str):
        """The current weight and state values, read on `device`."""
        with tf.device(device):
            weights = [tf.convert_to_tensor(v.value) for v in self.trainable_variables]
            state = [
                tf.convert_to_tensor(v.value) for v in self.non_trainable_variables
            ]
        return weights, state

    def commit(self, device: str, state: list, bn_stats_per_microbatch: list) -> None:
        """Assigns the stage's state after the last micro-batch of a mini-batch."""
        with tf.device(device):
            for variable, value, deferred in zip(
                self.non_trainable_variables, state, self.deferred_mask()
            ):
                if not deferred:
                    variable.assign(value)
            for j, layer in enumerate(self.deferred_layers()):
                _batchnorm.update_moving_statistics(
                    layer, [stats[j] for stats in bn_stats_per_microbatch]
                )


@functools.cache
def _call_takes_training(call_function) -> bool:
    parameters = inspect.signature(call_function).parameters
    return "training" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def _takes_training(layer) -> bool:
    # `stateless_call` passes keyword arguments straight to `call`.
    return _call_takes_training(type(layer).call)
