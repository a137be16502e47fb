"""The socket ring's rows and columns across machines (issue 37), workers as threads.

Each worker's rings are built over socket pairs (rows with shared memory, as
`SocketRing.connect` opens them on one machine), or opened by `connect` among
worker threads that claim machines (`test_ring_order`'s set-up).
"""

import threading

import ml_dtypes
import numpy as np
import pytest

from keras_replicator.communication.ring import _hierarchical, _socket_ring
from tests.communication.test_ring_order import connect_on_machines
from tests.communication.test_shared_memory import _linked_rings
from tests.communication.test_socket_ring import _rings, _together
from tests.communication.test_socket_ring_connect import (
    threads_as_workers,  # noqa: F401 - a fixture
)

pytestmark = pytest.mark.timeout(60)


def _grid_rings(machines, per_machine):
    """Each worker's `HierarchicalRing` (grouped order: worker p at position p)."""
    size = machines * per_machine
    flat = _rings(size)
    rows = [_linked_rings(per_machine) for _ in range(machines)]
    columns = [_rings(machines) for _ in range(per_machine)]
    return [
        _hierarchical.HierarchicalRing(
            flat[p],
            rows[p // per_machine][p % per_machine],
            columns[p % per_machine][p // per_machine],
        )
        for p in range(size)
    ]


def _on_every_worker(rings, call):
    """`test_socket_ring._together` with a longer limit: (results, errors)."""
    out, errors, _ = _together(rings, call, limit=30.0)
    return out, [e for e in errors if e is not None]


SHAPES = [(3, 5), (), (7,), (1, 1, 2), (0,), (11,)]  # chunks cross array borders


def _inputs(size, dtype):
    return [
        [
            np.random.default_rng(10 * r + i).normal(size=s).astype(dtype)
            for i, s in enumerate(SHAPES)
        ]
        for r in range(size)
    ]


@pytest.fixture(params=["one piece", "8 pieces"])
def pieces(request, monkeypatch):
    """Buffers in one piece, or in 8 (rows and columns overlapped)."""
    if request.param != "one piece":
        monkeypatch.setattr(_hierarchical, "PIECE_MIN_BYTES", 8)
    return request.param


@pytest.mark.parametrize("machines, per_machine", [(2, 2), (3, 2), (2, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("divide", [None, "divide_by", "counts"])
def test_sums_match_numpy_and_every_worker_holds_the_same_bits(
    machines, per_machine, dtype, divide, pieces
):
    size = machines * per_machine
    inputs = _inputs(size, dtype)
    counts = [np.array([2.0 + r], np.float32) for r in range(size)]

    def call(r, ring):
        if divide == "divide_by":
            return ring.all_reduce(*inputs[r], divide_by=np.float32(6.0))
        if divide == "counts":
            return ring.all_reduce(*inputs[r], counts=counts[r])
        return ring.all_reduce(*inputs[r])

    rings = _grid_rings(machines, per_machine)
    for _ in range(2):  # a second call on the same rings
        out, errors = _on_every_worker(rings, call)
        assert not errors, errors
    divisor = {None: 1.0, "divide_by": 6.0, "counts": sum(float(c[0]) for c in counts)}
    for i, shape in enumerate(SHAPES):
        expected = sum(inputs[r][i].astype(np.float64) for r in range(size))
        expected = expected / divisor[divide]
        assert out[0][i].shape == shape and out[0][i].dtype == dtype
        np.testing.assert_allclose(out[0][i], expected, rtol=1e-5, atol=1e-6)
    if divide == "counts":
        assert out[0][-1].dtype == np.float32
        assert float(out[0][-1][0]) == divisor["counts"]
    for r in range(1, size):
        for a, b in zip(out[0], out[r]):
            np.testing.assert_array_equal(
                a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
            )
    # Rows through shared memory, columns through sockets.
    assert all(ring.row._link.inbox is not None for ring in rings)
    assert all(ring.column._link.inbox is None for ring in rings)


def test_sixteen_bit_buffers_are_summed_like_the_flat_rings(pieces):
    inputs = _inputs(4, ml_dtypes.bfloat16)
    rings = _grid_rings(2, 2)
    out, errors = _on_every_worker(rings, lambda r, ring: ring.all_reduce(*inputs[r]))
    assert not errors, errors
    for i in range(len(SHAPES)):
        expected = sum(inputs[r][i].astype(np.float32) for r in range(4))
        np.testing.assert_allclose(out[0][i].astype(np.float32), expected, rtol=0.05)


def test_the_columns_carry_half_of_what_the_flat_ring_sends_between_machines():
    # 2 machines x 2 workers: the flat ring sends 2 (N - 1) / N = 1.5 buffers per
    # worker over links that (ordered by machine) cross machines on 2 of 4; a
    # column all-reduce sends 2 (H - 1) / H x 1/L = 0.5 buffer per worker.
    values = [np.ones(4000, np.float32) for _ in range(4)]
    rings = _grid_rings(2, 2)
    _, errors = _on_every_worker(rings, lambda r, ring: ring.all_reduce(values[r]))
    assert not errors, errors
    assert [ring.column.bytes_sent for ring in rings] == [4000 * 4 // 2] * 4
    assert [ring.flat.bytes_sent for ring in rings] == [0] * 4


def _fails(ring, method, after_calls, error):
    """Makes `ring.<method>` raise `error` once `ring` has made `after_calls` calls."""
    original = getattr(ring, method)

    def failing(*arrays, **kwargs):
        if ring.calls == after_calls:
            raise error
        return original(*arrays, **kwargs)

    setattr(ring, method, failing)


def test_pieces_overlap_and_a_column_failing_midway_fails_every_worker(monkeypatch):
    # 40 pieces: worker 3's column dies on its 5th call, while the rows hold
    # later pieces; every worker fails (none hangs) and stays failed.
    monkeypatch.setattr(_hierarchical, "PIECE_MIN_BYTES", 400)
    monkeypatch.setattr(_hierarchical, "PIECES", 40)
    assert len(_hierarchical._piece_bounds(4000, 4, 2)) == 41
    rings = _grid_rings(2, 2)
    _fails(rings[3].column, "all_reduce", 4, ConnectionError("killed by the test"))
    values = [np.ones(4000, np.float32) for _ in range(4)]
    _, errors = _on_every_worker(rings, lambda r, ring: ring.all_reduce(values[r]))
    assert len(errors) == 4 and all(isinstance(e, Exception) for e in errors)
    assert all(ring.column._failure is not None for ring in rings)
    assert "killed by the test" in rings[3].column._failure
    assert [t.name for t in threading.enumerate()].count("ring-columns") == 0


def test_a_row_failing_while_its_column_sends_keeps_the_first_cause(monkeypatch):
    monkeypatch.setattr(_hierarchical, "PIECE_MIN_BYTES", 400)
    rings = _grid_rings(2, 2)
    _fails(rings[0].row, "reduce_scatter", 2, ValueError("row broke"))  # 3rd call
    values = [np.ones(4000, np.float32) for _ in range(4)]
    _, errors = _on_every_worker(rings, lambda r, ring: ring.all_reduce(values[r]))
    assert len(errors) == 4
    # The column of worker 0 was failed for the row's error while its helper
    # thread was sending: its record names the row's error, not the closed socket.
    assert "row broke" in rings[0].column._failure


def test_a_failure_on_one_ring_fails_every_ring_of_the_worker(pieces):
    rings = _grid_rings(2, 2)
    rings[3].column._fail(RuntimeError("killed by the test"))  # worker 3 dies
    _, errors = _on_every_worker(
        rings, lambda r, ring: ring.all_reduce(np.ones(64, np.float32))
    )
    assert len(errors) == 4 and all(isinstance(e, RuntimeError) for e in errors)
    for ring in rings:
        with pytest.raises(RuntimeError, match="failed earlier"):
            ring.all_reduce(np.ones(64, np.float32))
        with pytest.raises(RuntimeError, match="failed earlier"):
            ring.reduce_scatter(np.ones(64, np.float32))


def test_connect_opens_rows_and_columns_on_a_grid_of_machines(
    threads_as_workers,  # noqa: F811 - the fixture
    monkeypatch,
):
    rings = connect_on_machines("ABAB", monkeypatch)
    assert all(isinstance(r, _hierarchical.HierarchicalRing) for r in rings)
    assert [ring.order for ring in rings] == [[0, 2, 1, 3]] * 4
    assert [(ring.row.rank, ring.column.rank) for ring in rings] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]  # workers 0, 2 on machine A; 1, 3 on B
    values = [np.arange(100, dtype=np.float64) * (r + 1) for r in range(4)]
    out, errors = _on_every_worker(rings, lambda r, ring: ring.all_reduce(values[r])[0])
    assert not errors, errors
    for result in out:
        np.testing.assert_array_equal(result, sum(values))


@pytest.mark.parametrize("machines", ["AAAA", "AAAB", "ABCD"])
def test_no_grid_keeps_the_flat_ring(threads_as_workers, monkeypatch, machines):  # noqa: F811
    rings = connect_on_machines(machines, monkeypatch)
    assert all(type(r) is _socket_ring.SocketRing for r in rings)


@pytest.mark.parametrize("setting", [None, "1", "0"])
def test_the_grid_is_the_default_and_0_keeps_the_flat_ring(
    threads_as_workers,  # noqa: F811 - the fixture
    monkeypatch,
    setting,
):
    rings = connect_on_machines("AABB", monkeypatch, grid=setting)
    wanted = (
        _socket_ring.SocketRing if setting == "0" else _hierarchical.HierarchicalRing
    )
    assert all(type(r) is wanted for r in rings)


def test_a_hierarchy_in_the_options_opens_the_grid_whatever_the_environment(
    threads_as_workers,  # noqa: F811 - the fixture
    monkeypatch,
):
    # `AllReduceOptions(hierarchy=...)` connects with grid=True.
    rings = connect_on_machines("ABAB", monkeypatch, grid="0", forced=True)
    assert all(isinstance(r, _hierarchical.HierarchicalRing) for r in rings)


def test_a_bad_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(_hierarchical.ENVIRONMENT_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match="KERAS_REPLICATOR_RING_HIERARCHY"):
        _hierarchical.enabled()


def test_the_grid_needs_equal_machines_of_two_or_more():
    keys = [[1, 0], [1, 0], [2, 0], [2, 0]]
    assert _hierarchical.grid([0, 1, 2, 3], keys) == [[0, 1], [2, 3]]
    assert _hierarchical.grid([0, 1, 2, 3], [[1, 0]] * 4) is None  # one machine
    assert _hierarchical.grid([0, 1, 2], [[1, 0], [2, 0], [3, 0]]) is None
