"""The hierarchical all-reduce on the ring's own transport: machines as rows (issue 37).

Why: between machines the network is the limit, inside one the memory. A flat ring
of `H` machines with `L` workers each (ordered by machine, `_setup.ring_order`)
sends `2 (N - 1) / N` of the buffer over every link, the links between machines
included, so each machine's network link carries 1.5x the buffer for 2 x 2
workers. As Ying et al.'s 2-D all-reduce does on a TPU torus, this one works in
rows and columns of the `H x L` grid:

1. a *row* is one machine's `L` workers: a reduce-scatter along it (shared
   memory, `_shared_memory`) leaves worker `l` of each machine that machine's
   sum of chunk `l`;
2. a *column* is worker `l` of every machine: an all-reduce of chunk `l` along
   it (sockets), so each of the `L` columns carries `1/L` of the buffer and the
   machine's link carries 2 (H - 1) / H of it: 1.0x for 2 machines;
3. an all-gather along the row spreads the `L` summed chunks.

The sample counts ride in every chunk (a copy each, summed exactly alongside) and
each worker divides its summed chunk before the all-gather, as the flat ring does
between its phases (`_division`). Each row and column is a `SocketRing`, so every
guarantee of the flat ring holds on each link: proven connections, a header
checked before any data, one deadline per call, and a failure on any of them
fails all three rings of this worker (and so, link by link, every worker's).

`reduce_scatter` and `all_gather` (weight-update sharding) stay on the flat ring,
which is ordered by machine.

Hand-written: TensorFlow's sub-group collectives (`_hierarchy`) run over gRPC,
which the socket ring exists to avoid (docs/communication.md).
"""

from __future__ import annotations

import os

import numpy as np

from keras_replicator.communication import _division
from keras_replicator.communication.ring import _frames

_EXACT_COUNTS = (np.float32, np.float64)  # counts ride as the buffer's dtype


def grid(order, machines):
    """The `H x L` grid of ring positions, or None if the machines are unequal.

    Args:
        order: The worker at each ring position (`_setup.ring_order`: grouped).
        machines: Each worker's machine key, by worker.

    Returns:
        A list of `H` rows (one per machine, in ring order), each the `L` ring
        positions of that machine's workers; None unless there are at least 2
        machines with the same number (at least 2) of workers each.

    Example:
    >>> grid([0, 2, 1, 3], [[1, 0], [2, 0], [1, 0], [2, 0]])
    [[0, 1], [2, 3]]
    >>> grid([0, 1, 2], [[1, 0], [1, 0], [2, 0]]) is None  # 2 and 1 workers
    True
    """
    rows: list[list[int]] = []
    last = None
    for position, worker in enumerate(order):
        key = tuple(float(v) for v in machines[worker])
        if key != last:
            rows.append([])
            last = key
        rows[-1].append(position)
    sizes = {len(row) for row in rows}
    if len(rows) < 2 or len(sizes) != 1 or sizes.pop() < 2:
        return None
    return rows


class HierarchicalRing:
    """A flat ring with rows and columns: `all_reduce` in three phases (above).

    Args:
        flat: This worker's flat `SocketRing` (ordered by machine).
        row: This worker's ring among its machine's workers.
        column: This worker's ring among the workers of its column.

    Attributes:
        rank, size, order, replica: The flat ring's.
    """

    def __init__(self, flat, row, column):
        self.flat, self.row, self.column = flat, row, column
        self.rank, self.size = flat.rank, flat.size
        self.order, self.replica = flat.order, flat.replica

    @property
    def rings(self):
        return (self.flat, self.row, self.column)

    @property
    def calls(self) -> int:
        """Ring protocols run, on all three rings."""
        return sum(ring.calls for ring in self.rings)

    @property
    def bytes_sent(self) -> int:
        """Payload bytes this worker sent, on all three rings."""
        return sum(ring.bytes_sent for ring in self.rings)

    def all_reduce(self, *arrays, divide_by=None, counts=None) -> list[np.ndarray]:
        """`SocketRing.all_reduce`'s contract, through the rows and columns."""
        flats = [a.reshape(-1) for a in arrays]
        dtype = flats[0].dtype if flats else np.dtype("float32")
        if counts is not None and (divide_by is not None or dtype not in _EXACT_COUNTS):
            # The flat ring says what is wrong (both given), or sums 16-bit
            # buffers with float32 counts (every worker decides alike).
            return self._guarded(
                self.flat.all_reduce, *arrays, divide_by=divide_by, counts=counts
            )
        return self._guarded(
            self._three_phases, flats, arrays, dtype, divide_by, counts
        )

    def reduce_scatter(self, flat: np.ndarray) -> np.ndarray:
        """The flat ring's (`SocketRing.reduce_scatter`)."""
        return self._guarded(self.flat.reduce_scatter, flat)

    def all_gather(self, chunk: np.ndarray) -> np.ndarray:
        """The flat ring's (`SocketRing.all_gather`)."""
        return self._guarded(self.flat.all_gather, chunk)

    def _guarded(self, function, *args, **kwargs):
        try:
            return function(*args, **kwargs)
        except BaseException as error:
            # Neighbours wait on the other rings too: fail them all at once.
            for ring in self.rings:
                if ring._failure is None:
                    ring._fail(error)
            raise

    def _three_phases(self, flats, arrays, dtype, divide_by, counts):
        width_of_row = self.row.size
        total = sum(f.size for f in flats)
        count_values = None
        if counts is not None:
            count_values = np.asarray(counts, np.float32).reshape(-1)
        extra = 0 if count_values is None else count_values.size
        per = -(-total // width_of_row)  # values of one chunk
        width = per + extra
        buffer = _frames.aligned_empty(width_of_row * width, dtype)
        grid_view = buffer.reshape(width_of_row, width)
        _pack(flats, grid_view[:, :per])
        if count_values is not None:
            grid_view[:, per:] = count_values.astype(dtype)
        mine = self.row.reduce_scatter(buffer)  # this machine's sum of my chunk
        (summed,) = self.column.all_reduce(mine)  # every machine's
        divisor = divide_by if count_values is None else summed[per : per + 1]
        if divisor is not None:
            _division.divide_in_place([summed[:per]], divisor)
        gathered = self.row.all_gather(summed).reshape(width_of_row, width)
        results = _unpack(gathered[:, :per], arrays, dtype)
        if count_values is None:
            return results
        return [*results, gathered[0, per:].astype(np.float32)]


def _pack(flats, rows) -> None:
    """Copies the concatenated `flats` into `rows` (row-major), zero-padded."""
    flat_rows = rows.shape[1]
    position = 0
    for flat in flats:
        done = 0
        while done < flat.size:
            row, column = divmod(position, flat_rows)
            take = min(flat_rows - column, flat.size - done)
            rows[row, column : column + take] = flat[done : done + take]
            done += take
            position += take
    while position < rows.size:  # the padding: zeros, summed and dropped
        row, column = divmod(position, flat_rows)
        rows[row, column:] = 0
        position += flat_rows - column


def _unpack(rows, arrays, dtype) -> list[np.ndarray]:
    """The arrays of `arrays`' shapes, read back from `rows` as `_pack` wrote them."""
    flat_rows = rows.shape[1]
    results, position = [], 0
    for array in arrays:
        out = _frames.aligned_empty(array.size, dtype)
        done = 0
        while done < out.size:
            row, column = divmod(position, flat_rows)
            take = min(flat_rows - column, out.size - done)
            out[done : done + take] = rows[row, column : column + take]
            done += take
            position += take
        results.append(out.reshape(array.shape))
    return results


ENVIRONMENT_VARIABLE = "KERAS_REPLICATOR_RING_HIERARCHY"


def enabled() -> bool:
    """Whether `KERAS_REPLICATOR_RING_HIERARCHY=1` asks for rows and columns
    wherever the machines form a grid (default: no, the flat ring ordered by
    machine, which trained faster on the simulated machines: docs/communication.md).

    Example:
    >>> isinstance(enabled(), bool)
    True
    """
    value = os.environ.get(ENVIRONMENT_VARIABLE, "0").strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no", ""):
        return False
    raise ValueError(
        f"`{ENVIRONMENT_VARIABLE}` must be 1 (rows and columns across machines) or "
        f"0 (the flat ring, the default). Received: {ENVIRONMENT_VARIABLE}="
        f"{os.environ[ENVIRONMENT_VARIABLE]!r}."
    )
