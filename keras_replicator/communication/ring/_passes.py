"""The arithmetic of one ring step on received bytes, in as few passes as it can.

The socket ring is bound by memory bandwidth (issue 36), which both workers share
with each other and with the step's matmuls. So what a worker does to a chunk it
received happens block by block (`BLOCK_BYTES`, while the block is in cache):
added to its own chunk (`sum_into`; 16-bit floats in float32), divided by the
summed sample count when it is the reduce's final sum (`Finish`, with
`_division.divider`'s bits), and copied into the outbox slot the next step sends
from (`_shared_memory` calls that staging). One read of the received bytes, where
the add, the division and the copy were three passes.
"""

from __future__ import annotations

import numpy as np

from keras_replicator.communication import _division

BLOCK_BYTES = 256 * 1024  # a block read, added, divided and staged in one go
DIVIDED_HERE = (np.float32, np.float64)  # `_division.divide_in_place`'s dtypes


class Finish:
    """What the final step of a reduce does to the sums it receives, in one pass.

    Args:
        divisor: A callable returning what to divide the sums by (a count, read
            once the trailing `counts` pieces are summed), or returning None.
        counts: How many trailing pieces are sample counts: summed first, never
            divided.

    Attributes:
        applied: Whether the division was done (else the caller divides).
    """

    def __init__(self, divisor, counts: int = 0):
        self.divisor, self.counts, self.applied = divisor, counts, False


def read_blocks(flat, shared, own, divisor, staged) -> None:
    """`flat = shared (+ own)`, divided by `divisor`, copied into `staged`: by block."""
    if divisor is None and staged is None:  # one pass already
        if own is None:
            flat[...] = shared
        else:
            sum_into(flat, shared, own)
        return
    divide = None if divisor is None else _division.divider(divisor, flat.dtype)
    block = max(1, BLOCK_BYTES // flat.itemsize)
    for lo in range(0, flat.size, block):
        hi = lo + block
        part = flat[lo:hi]
        if own is None:
            part[...] = shared[lo:hi]
        else:
            sum_into(part, shared[lo:hi], own[lo:hi])
        if divide is not None:
            divide(part)
        if staged is not None:
            staged[lo:hi] = part


def add_into(incoming, plus) -> None:
    """Adds each of `plus` into the matching array of `incoming` (16-bit in float32)."""
    for part, own in zip(incoming, plus or ()):
        sum_into(part, part, own)


def sum_into(out, a, b) -> None:
    """`out = a + b`; 16-bit floats added in float32 (numpy has no fast 16-bit add)."""
    if out.dtype.itemsize < 4:
        out[...] = (a.astype(np.float32) + b.astype(np.float32)).astype(out.dtype)
    else:
        np.add(a, b, out=out)
