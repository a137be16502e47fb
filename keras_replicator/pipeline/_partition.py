"""Partition: the chain of layers a pipeline cuts, and the cut itself.

A pipeline can only cut a model where exactly one tensor crosses the cut, so the
model must be a single chain: each layer's only input is the previous layer's only
output. A `Sequential` model always is one; a functional model is one when no layer
is shared, branched or merged (residual blocks must be wrapped as layers first).
"""

from __future__ import annotations

from collections.abc import Sequence

import keras


def chain_of_layers(model_or_layers) -> list[keras.layers.Layer]:
    """The layers of `model_or_layers` in order, checking that they form a chain.

    Args:
        model_or_layers: a `keras.Sequential`, a functional `keras.Model` whose
            layers form a single chain, or a list of layers.

    Returns:
        The layers in call order, without `InputLayer`s.

    Raises:
        ValueError: if the model has branches, shared layers or several inputs or
            outputs, or has no layers.
        TypeError: if `model_or_layers` is neither a model nor a list of layers.

    Example:
    >>> import keras
    >>> model = keras.Sequential([keras.layers.Dense(2), keras.layers.Dense(1)])
    >>> len(chain_of_layers(model))
    2
    """
    if isinstance(model_or_layers, keras.Sequential):
        layers = list(model_or_layers.layers)
    elif isinstance(model_or_layers, keras.Model):
        layers = _functional_chain(model_or_layers)
    elif isinstance(model_or_layers, (list, tuple)):
        layers = list(model_or_layers)
        for layer in layers:
            if not isinstance(layer, keras.layers.Layer):
                raise TypeError(
                    "`model_or_layers` must be a Keras model or a list of Keras "
                    f"layers. Received a list containing {layer!r} of type "
                    f"{type(layer).__name__}."
                )
    else:
        raise TypeError(
            "`model_or_layers` must be a `keras.Sequential`, a functional "
            "`keras.Model` with a single chain of layers, or a list of layers. "
            f"Received: model_or_layers={model_or_layers!r} of type "
            f"{type(model_or_layers).__name__}."
        )
    layers = [x for x in layers if not isinstance(x, keras.layers.InputLayer)]
    if not layers:
        raise ValueError(
            "`model_or_layers` must contain at least one layer. "
            f"Received: model_or_layers={model_or_layers!r}."
        )
    return layers


def _functional_chain(model: keras.Model) -> list[keras.layers.Layer]:
    if not hasattr(model, "inputs") or model.inputs is None:
        raise ValueError(
            "`model_or_layers` must be a `Sequential` or functional model; a "
            f"subclassed model cannot be cut into stages. Received: {model.name!r}. "
            "Pass its layers as a list if they form a chain."
        )
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ValueError(
            "`model_or_layers` must have one input and one output to be cut into "
            f"stages. Received: a model with {len(model.inputs)} inputs and "
            f"{len(model.outputs)} outputs."
        )
    layers = [x for x in model.layers if not isinstance(x, keras.layers.InputLayer)]
    previous = model.inputs[0]
    for layer in layers:
        try:
            layer_input = layer.input
        except (AttributeError, ValueError):
            layer_input = None
        if layer_input is not previous:
            raise ValueError(
                "`model_or_layers` has branches that cannot be cut: layer "
                f"{layer.name!r} does not take exactly the output of the layer "
                "before it (a shared layer, a skip connection, a merge or an op "
                "between layers). Wrap each branching block in a layer so the "
                "model is a single chain."
            )
        previous = layer.output
    if model.outputs[0] is not previous:
        raise ValueError(
            "`model_or_layers` has branches that cannot be cut: its output is not "
            f"the output of its last layer {layers[-1].name!r}."
        )
    return layers


def check_balance(balance: Sequence[int], num_layers: int) -> list[int]:
    """Validates layers-per-stage `balance` against `num_layers`.

    Example:
    >>> check_balance([2, 1], 3)
    [2, 1]
    """
    if isinstance(balance, (str, bytes)) or not isinstance(balance, Sequence):
        raise TypeError(
            "`balance` must be a list of layer counts per stage or None. "
            f"Received: balance={balance!r}."
        )
    balance = list(balance)
    if not balance or any(
        isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in balance
    ):
        raise ValueError(
            "`balance` must be a non-empty list of positive layer counts per stage. "
            f"Received: balance={balance!r}."
        )
    if sum(balance) != num_layers:
        raise ValueError(
            f"`balance` must sum to the model's {num_layers} layers (InputLayer "
            f"excluded). Received: balance={balance!r}, which sums to "
            f"{sum(balance)}. Use e.g. `keras_replicator.pipeline.balance_by_size`."
        )
    return balance


def even_balance(num_layers: int, num_stages: int) -> list[int]:
    """Layers per stage when splitting `num_layers` as evenly as possible.

    Example:
    >>> even_balance(5, 2)
    [3, 2]
    """
    num_stages = min(num_stages, num_layers)
    base, extra = divmod(num_layers, num_stages)
    return [base + (1 if k < extra else 0) for k in range(num_stages)]


def split(layers: Sequence, balance: Sequence[int]) -> list[list]:
    """Cuts `layers` into consecutive stages of `balance[k]` layers.

    Example:
    >>> split(["a", "b", "c"], [2, 1])
    [['a', 'b'], ['c']]
    """
    stages, start = [], 0
    for count in balance:
        stages.append(list(layers[start : start + count]))
        start += count
    return stages
