"""The socket ring's arrays: checked inputs, outputs and the sample counts' slots.

`SocketRing`'s calls read and write numpy arrays in place (scatter-gather socket
calls, shared memory); these are the checks and allocations around them, with
Keras-style errors naming the argument.
"""

from __future__ import annotations

import numpy as np

from keras_replicator.communication.ring import _frames


def output(out, size: int, dtype, inputs=()) -> np.ndarray:
    """`out` (1-D, apart from `inputs`: checked) or a new 64-byte aligned array
    of `size` values."""
    if out is None:
        return _frames.aligned_empty(size, dtype)
    if out.shape != (size,) or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(
            f"`out` must be a contiguous 1-D array of {size} {np.dtype(dtype)} "
            f"values. Received: out.shape={out.shape}, out.dtype={out.dtype}."
        )
    if any(np.may_share_memory(out, array) for array in inputs):
        raise ValueError(
            "`out` must not overlap the inputs: partial sums arrive in it while "
            "the inputs are still being added. Received: an `out` that shares "
            "memory with an input. Pass a separate array."
        )
    return out


def vector(array, name: str, workers: int = 1) -> np.ndarray:
    """`array` as contiguous 1-D, or a `ValueError` naming `name`."""
    array = np.asarray(array)
    if array.ndim != 1:
        raise ValueError(
            f"`{name}` must be a 1-D array. Received: {name}.shape={array.shape}. "
            f"Pass `{name}.reshape(-1)`."
        )
    if array.size % workers:
        raise ValueError(
            f"`{name}` must hold a multiple of the ring's {workers} workers' values, "
            f"one equal chunk each. Received: {name}.size={array.size}. Pad it "
            f"to {-(-array.size // workers) * workers} values."
        )
    return np.ascontiguousarray(array)


def count_slots(counts, workers: int):
    """`counts` copied once per chunk (float32) and room for each chunk's sums."""
    if counts is None:
        return None
    counts = np.asarray(counts, np.float32).reshape(-1)
    own = _frames.aligned_empty(workers * counts.size, np.float32).reshape(workers, -1)
    own[...] = counts
    return own, np.zeros_like(own)
