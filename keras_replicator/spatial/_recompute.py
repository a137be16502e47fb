"""A window op whose extended tile is rebuilt for the backward pass, never kept.

`_halo.assemble` makes a new tensor the size of the tile (the tile with its halo
rows, sliced and padded along the width), and a convolution keeps its input for
its backward pass: kept, that copy would double every convolution's activation
memory, and splitting an image over 2 replicas would save only 30% per replica
(measured in `benchmarks/spatial.py`: 0.70x of one device's peak at P=2). So the
op runs inside a `tf.custom_gradient` that keeps only the tile and its halo rows
(which the network holds anyway) and, in the backward pass, assembles the
extended tile again (a concatenation and a pad: cheap next to the convolution)
to take the op's gradients. The convolution's forward is not recomputed: its
gradients read only its inputs, so TensorFlow prunes the recomputed output unless
a fused activation needs it.

The rebuilt tile reads its inputs through identities with a control dependency
on the incoming gradient, so it cannot be computed early and held until the
backward pass (the reason `tf.recompute_grad` saves nothing in a graph; see
`keras_replicator.pipeline._checkpoint`).

Layers that compute in another dtype than their variables (mixed precision) keep
the plain path: Keras casts the variables only inside the layer's `__call__`,
which the backward pass runs outside of.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


def without_keeping_input(
    op: Callable, assemble: Callable, tile: tf.Tensor, halos: list
) -> tf.Tensor:
    """`op(assemble(tile, *halos))`, with gradients through a rebuilt input.

    Args:
        op: The window op on the extended tile (reads the layer's variables).
        assemble: `(tile, *halos) -> extended tile`, free of collectives.
        tile: This replica's tile.
        halos: The rows received from the neighbours (empty without a halo).

    Returns:
        The op's output; gradients flow to `tile`, `halos` and the variables
        the op reads.

    Example:
    >>> kernel = tf.Variable([[[[2.0]]]])
    >>> x = tf.ones((1, 2, 2, 1))
    >>> with tf.GradientTape() as tape:
    ...     tape.watch(x)
    ...     y = without_keeping_input(
    ...         lambda e: tf.nn.conv2d(e, kernel, 1, "VALID"), lambda t: t, x, [])
    >>> [float(g.numpy().sum()) for g in tape.gradient(y, [x, kernel])]
    [8.0, 4.0]
    """

    @tf.custom_gradient
    def forward(*inputs):
        output = op(assemble(*inputs))

        def backward(upstream, variables=None):
            variables = list(variables or [])
            with tf.control_dependencies([upstream]):
                again = [tf.identity(value) for value in inputs]
            with tf.GradientTape() as tape:
                tape.watch(again)
                output_again = op(assemble(*again))
            gradients = tape.gradient(
                output_again,
                [*again, *variables],
                output_gradients=upstream,
                unconnected_gradients=tf.UnconnectedGradients.ZERO,
            )
            return gradients[: len(again)], gradients[len(again) :]

        return output, backward

    return forward(tile, *halos)
