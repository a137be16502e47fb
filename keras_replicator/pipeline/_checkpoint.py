"""Re-materialization: keep a stage's input, recompute its activations when needed.

GPipe stores only the activations at stage boundaries during the forward pass and
recomputes each stage's forward pass just before its backward pass (Huang et al.
2019, section 2.2), so peak activation memory per stage falls from
O(M * layers/K * batch/M) to O(batch + layers/K * batch/M).

Why not `tf.recompute_grad`: in a `tf.function` graph it builds the recomputation as
ops whose inputs (the stage input and the weights) are ready during the forward
pass, and TensorFlow's executor runs every op as soon as its inputs are ready: the
"recomputed" activations are then computed right away and held until the backward
pass, which saves nothing. Here the recomputation reads its inputs through
identities that have a control dependency on the incoming gradient, so it cannot
start before the backward pass reaches the stage. The forward function is pure
(it takes the weights as tensors through Keras' `stateless_call`), so the second
run sees the same weights and the same random seeds (dropout masks are equal) and
updates no state; state updates are taken from the first run only.

The recomputations of one stage are also chained: each waits (control dependency)
for the gradients of the stage's previously built backward pass, so at most one
micro-batch's recomputed activations per stage are alive at a time. Without the
chain, the M backward passes of the last stage become ready together (their
gradients come from one loss) and the executor interleaves them, holding up to M
micro-batches of recomputed activations. The chain follows the order in which the
tape builds the backward passes, so it cannot form a cycle.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


class BackwardChain:
    """The last backward pass built for a stage, which the next one waits for."""

    def __init__(self):
        self.last: list = []

    def after(self) -> list:
        return list(self.last)

    def record(self, grads: list) -> None:
        self.last = [g for g in grads if g is not None]


def checkpointed(
    run: Callable, x, weights: list, device: str, chain: BackwardChain | None = None
):
    """Runs `y, extras = run(x, weights)`, recomputing it during back-propagation.

    Args:
        run: a pure function of a tensor `x` and a list of weight tensors, returning
            an output tensor and a nest of non-differentiable extras (state
            updates, statistics).
        x: the stage input.
        weights: the trainable weight values (tensors read from the variables).
        device: where the recomputation runs.
        chain: the stage's `BackwardChain`; recomputations sharing one run one
            after another. None runs this one as soon as its gradient is ready.

    Returns:
        `(y, extras)` from the forward run; gradients of `y` flow to `x` and
        `weights` through a recomputation.

    Example:
    >>> w = tf.Variable(2.0)
    >>> with tf.GradientTape() as tape:
    ...     y, _ = checkpointed(lambda x, ws: (x * ws[0], ()), tf.constant(3.0),
    ...                         [w.read_value()], "/cpu:0")
    >>> float(tape.gradient(y, w))
    3.0
    """
    extras = []

    @tf.custom_gradient
    def forward(x, *weights):
        y, first_extras = run(x, list(weights))
        extras.append(first_extras)

        def backward(dy):
            with tf.device(device):
                waits_for = [dy, *(chain.after() if chain is not None else [])]
                with tf.control_dependencies(waits_for):
                    x_again = tf.identity(x)
                    weights_again = [tf.identity(w) for w in weights]
                with tf.GradientTape() as tape:
                    tape.watch([x_again, *weights_again])
                    y_again, _ = run(x_again, weights_again)
                grads = tape.gradient(
                    y_again,
                    [x_again, *weights_again],
                    output_gradients=dy,
                    unconnected_gradients=tf.UnconnectedGradients.ZERO,
                )
            if chain is not None:
                chain.record(grads)
            return grads

        return tf.identity(y), backward

    y = forward(x, *weights)
    return y, extras[0]
