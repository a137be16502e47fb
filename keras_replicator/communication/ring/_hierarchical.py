"""The hierarchical all-reduce on the ring's own transport: machines as rows (issue 37).

Why: between machines the network is the limit, inside one the memory. A flat ring
of `H` machines with `L` workers each (ordered by machine, `_setup.ring_order`)
sends `2 (N - 1) / N` of the buffer over every link, the links between machines
included, so each machine's network link carries 1.5x the buffer for 2 x 2
workers. As Ying et al.'s 2-D all-reduce does on a TPU torus, this one works in
rows and columns of the `H x L` grid (`communication/_grid`: the one 2-D design,
which `_hierarchy` runs on TensorFlow's collectives):

1. a *row* is one machine's `L` workers: a reduce-scatter along it (shared
   memory, `_shared_memory`) leaves worker `l` of each machine that machine's
   sum of chunk `l`;
2. a *column* is worker `l` of every machine: an all-reduce of chunk `l` along
   it (sockets), so each of the `L` columns carries `1/L` of the buffer and the
   machine's link carries 2 (H - 1) / H of it: 1.0x for 2 machines;
3. an all-gather along the row spreads the `L` summed chunks.

A call is cut into pieces (`PIECES`) whose phases overlap (`_pipelined`): while
one piece's column waits on the network, the rows pack, sum and gather others,
so the whole takes about the column phase alone (1.5x the flat ring's speed on 2
x 2 simulated machines at 1 Gbit/s, docs/communication.md).

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
import queue
import threading

import numpy as np

from keras_replicator import _environment
from keras_replicator.communication import _division, _grid
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
        self.overlaps = flat.overlaps
        self._buffers: dict = {}  # `_scratch`'s

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
            self._fail_all(error)
            raise

    def _fail_all(self, error) -> None:
        """Neighbours wait on the other rings too: fails them all at once."""
        for ring in self.rings:
            if ring._failure is None:
                ring._fail(error)

    def _three_phases(self, flats, arrays, dtype, divide_by, counts):
        """Piece by piece: the rows of one piece run while a column sends another."""
        total, width_of_row = sum(f.size for f in flats), self.row.size
        count_values = None
        if counts is not None:
            count_values = np.asarray(counts, np.float32).reshape(-1)
        extra = 0 if count_values is None else count_values.size
        results = [_frames.aligned_empty(f.size, dtype) for f in flats]
        bounds = _piece_bounds(total, dtype.itemsize, width_of_row)
        summed_counts = []

        def row_in(piece, lo, hi):  # pack, then the row's reduce-scatter
            per = _grid.chunk_size(hi - lo, width_of_row)  # values of a row chunk
            packed = self._scratch("packed", 0, width_of_row * (per + extra), dtype)
            grid_view = packed.reshape(width_of_row, per + extra)
            _copy_range(flats, lo, hi, grid_view[:, :per], into_rows=True)
            if count_values is not None:
                grid_view[:, per:] = count_values.astype(dtype)
            mine = self._scratch("mine", piece, per + extra, dtype)
            return piece, per, self.row.reduce_scatter(packed, out=mine)

        def column(held):  # every machine's sum of my chunk, divided
            piece, per, mine = held
            summed = self._scratch("summed", piece, mine.size, dtype)
            self.column.all_reduce(mine, out=[summed])
            divisor = divide_by if count_values is None else summed[per : per + 1]
            if divisor is not None:
                _division.divide_in_place([summed[:per]], divisor)
            return per, summed

        def row_out(piece, lo, hi, done):  # the row's all-gather, then unpack
            per, summed = done
            gathered = self._scratch("gathered", 0, width_of_row * summed.size, dtype)
            self.row.all_gather(summed, out=gathered)
            gathered = gathered.reshape(width_of_row, -1)
            _copy_range(results, lo, hi, gathered[:, :per], into_rows=False)
            if piece == 0 and count_values is not None:
                summed_counts.append(gathered[0, per:].astype(np.float32))

        _pipelined(bounds, row_in, column, row_out, self._fail_all)
        outputs = [r.reshape(a.shape) for r, a in zip(results, arrays)]
        if count_values is None:
            return outputs
        return [*outputs, summed_counts[0]]

    def _scratch(self, name: str, index: int, size: int, dtype) -> np.ndarray:
        """A reused buffer of `size` values: fresh pages cost a fault each.

        Held between calls, one set per dtype (about 1.1x the largest buffer
        summed, for 2 workers a machine); each piece of a call has its own
        `mine` and `summed`, as the rows and the column hold them at once."""
        key = (name, index, np.dtype(dtype).str)  # calls alternate dtypes
        held = self._buffers.get(key)
        if held is None or held.size < size:
            held = _frames.aligned_empty(size, dtype)
            self._buffers[key] = held
        return held[:size]


# Each call is cut into `PIECES` pieces (none under `PIECE_MIN_BYTES`): one
# piece's rows run while the column sends another's. Measured on 2 simulated
# machines x 2 workers at 1 Gbit/s (docs/communication.md): 4, 6, 8 and 12
# pieces of 25 / 100 MB took 0.253 / 1.086, 0.247 / 0.999, 0.248 / 0.974 and
# 0.251 / 0.999 s; fixed 1 MB pieces 0.268 / 1.139 s (each call costs a little).
PIECES = 8
PIECE_MIN_BYTES = 1 << 20


def _piece_bounds(total: int, itemsize: int, row_size: int) -> list[int]:
    """Where the pieces of a `total`-value buffer start and end: `PIECES` of
    them, each at least `PIECE_MIN_BYTES` and `row_size` values (one piece
    for a small buffer).

    Example:
    >>> _piece_bounds(10, 4, 2), _piece_bounds(0, 4, 2)
    ([0, 10], [0, 0])
    >>> _piece_bounds(3 * (1 << 20), 4, 2)  # 12 MB: 8 pieces of 1.5 MB
    [0, 393216, 786432, 1179648, 1572864, 1966080, 2359296, 2752512, 3145728]
    """
    smallest = max(PIECE_MIN_BYTES // itemsize, row_size, 1)
    pieces = max(1, min(PIECES, total // smallest))
    return [k * total // pieces for k in range(pieces + 1)]


def _pipelined(bounds, row_in, column, row_out, fail) -> None:
    """Runs each piece's `row_in`, `column` and `row_out`, overlapped.

    This thread runs every piece's `row_in`, then every piece's `row_out` as its
    column finishes; a helper thread runs the columns in piece order. So each
    ring's calls come in one order on every worker (their protocols pair up),
    and while a column waits on the network, the rows pack and sum other
    pieces. One piece runs on this thread alone. A failure in either thread
    is passed to `fail` (which fails every ring, so the other thread's calls
    fail at once) before the helper is joined, and raised here.
    """
    pieces = list(enumerate(zip(bounds[:-1], bounds[1:])))
    if len(pieces) == 1:
        row_out(0, *pieces[0][1], column(row_in(0, *pieces[0][1])))
        return
    inbox: queue.Queue = queue.Queue()
    outbox: queue.Queue = queue.Queue()

    def columns():
        for _ in pieces:
            mine = inbox.get()
            if mine is None:
                return
            try:
                outbox.put((column(mine), None))
            except BaseException as error:  # noqa: BLE001 - raised on the row thread
                outbox.put((None, error))
                return

    helper = threading.Thread(target=columns, name="ring-columns", daemon=True)
    helper.start()
    try:
        for piece, (lo, hi) in pieces:
            inbox.put(row_in(piece, lo, hi))
        for piece, (lo, hi) in pieces:
            done, error = outbox.get()
            if error is not None:
                raise error
            row_out(piece, lo, hi, done)
    except BaseException as error:
        fail(error)
        raise
    finally:
        inbox.put(None)  # a column still waiting for a piece stops
        helper.join()


def _copy_range(flats, lo, hi, rows, into_rows: bool) -> None:
    """Copies values `lo:hi` of the concatenated `flats` into `rows` (row-major,
    zeros after them) if `into_rows`, else from `rows` into `flats`.

    Example:
    >>> rows = np.full((2, 3), -1.0)
    >>> _copy_range([np.arange(4.0), np.arange(4.0, 8.0)], 3, 8, rows, True)
    >>> rows
    array([[3., 4., 5.],
           [6., 7., 0.]])
    """
    width, start = rows.shape[1], 0
    for flat in flats:
        a, b = max(lo, start), min(hi, start + flat.size)
        while a < b:
            row, column = divmod(a - lo, width)
            take = min(width - column, b - a)
            piece = flat[a - start : a - start + take]
            if into_rows:
                rows[row, column : column + take] = piece
            else:
                piece[...] = rows[row, column : column + take]
            a += take
        start += flat.size
    if into_rows:  # the padding: zeros, summed and dropped
        row, column = divmod(hi - lo, width) if width else (rows.shape[0], 0)
        if row < rows.shape[0]:
            rows[row, column:] = 0
            rows[row + 1 :] = 0


ENVIRONMENT_VARIABLE = _environment.RING_HIERARCHY


def enabled() -> bool:
    """Whether rows and columns are used wherever the machines form a grid:
    yes by default (the fastest on the simulated machines, docs/communication.md);
    `KERAS_REPLICATOR_RING_HIERARCHY=0` keeps the flat ring ordered by machine.

    Example:
    >>> isinstance(enabled(), bool)
    True
    """
    value = os.environ.get(ENVIRONMENT_VARIABLE, "1").strip().lower()
    if value in ("1", "true", "yes", ""):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ValueError(
        f"`{ENVIRONMENT_VARIABLE}` must be 1 (rows and columns across machines, "
        f"the default) or 0 (the flat ring). Received: {ENVIRONMENT_VARIABLE}="
        f"{os.environ[ENVIRONMENT_VARIABLE]!r}."
    )
