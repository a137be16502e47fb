"""The socket ring follows the machines, not TF_CONFIG's list (issue 37).

Workers are threads (`test_socket_ring_connect`'s fixture plays the strategy's
table all-reduce); each thread claims a machine through `_setup.machine_key`.
"""

import os
import socket
import threading

import numpy as np
import pytest

from keras_replicator.communication.ring import _hierarchical, _setup, _socket_ring
from tests.communication.test_socket_ring_connect import (
    _Exchange,
    _Worker,
    threads_as_workers,  # noqa: F401 - a fixture
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "machines, order",
    [
        ("AAAA", [0, 1, 2, 3]),
        ("ABAB", [0, 2, 1, 3]),  # as schedulers may list them
        ("AABB", [0, 1, 2, 3]),  # already grouped: TF_CONFIG's order
        ("ABCABC", [0, 3, 1, 4, 2, 5]),
        ("BAAB", [0, 3, 1, 2]),  # the groups in the order of their first worker
    ],
)
def test_workers_of_one_machine_are_neighbours(machines, order):
    keys = [[float(ord(m)), 0.0] for m in machines]
    assert _setup.ring_order(keys) == order
    links = [(order[p], order[(p + 1) % len(order)]) for p in range(len(order))]
    crossings = sum(machines[a] != machines[b] for a, b in links)
    assert crossings == (len(set(machines)) if len(set(machines)) > 1 else 0)


def test_a_machine_key_names_this_boot_and_namespaces():
    key = _setup.machine_key()
    assert key == _setup.machine_key()
    assert all(float(int(k)) == k and 0 <= k < 2**24 for k in key)
    assert np.array([key], np.float32).astype(np.float64).tolist() == [key]


def _ordered_rings(order):
    """Rings over socket pairs whose positions hold the workers `order` names."""
    size = len(order)
    edges = [socket.socketpair() for _ in range(size)]  # edge p: p -> p + 1
    for pair in edges:
        for s in pair:
            s.settimeout(10.0)
    rings = [
        _socket_ring.SocketRing(
            p, size, edges[p][0], edges[(p - 1) % size][1], order=order
        )
        for p in range(size)
    ]
    return {ring.replica: ring for ring in rings}  # by worker


def _on_every_worker(rings, call):
    out, errors = {}, []

    def work(worker):
        try:
            out[worker] = call(worker, rings[worker])
        except Exception as error:  # noqa: BLE001 - checked below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(w,)) for w in rings]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return out


@pytest.mark.parametrize("order", [[0, 2, 1, 3], [2, 0, 1], [1, 0]])
def test_the_phases_number_their_chunks_by_worker_not_by_position(order):
    size = len(order)
    rng = np.random.default_rng(size)
    flats = {w: rng.integers(-8, 8, size * 5).astype(np.float64) for w in range(size)}
    total = sum(flats.values())
    rings = _ordered_rings(order)
    scattered = _on_every_worker(rings, lambda w, ring: ring.reduce_scatter(flats[w]))
    for worker, chunk in scattered.items():  # worker w keeps row w, as sharding needs
        np.testing.assert_array_equal(chunk, total[worker * 5 : (worker + 1) * 5])
    gathered = _on_every_worker(rings, lambda w, ring: ring.all_gather(scattered[w]))
    for result in gathered.values():  # in worker order
        np.testing.assert_array_equal(result, total)
    summed = _on_every_worker(rings, lambda w, ring: ring.all_reduce(flats[w])[0])
    for result in summed.values():
        np.testing.assert_array_equal(result, total)


def test_an_order_that_misses_a_worker_is_an_early_error():
    a, b = socket.socketpair()
    with pytest.raises(ValueError, match=r"order=\[0, 0\]"):
        _socket_ring.SocketRing(0, 2, a, b, order=[0, 0])


def connect_on_machines(machines, monkeypatch, grid="1", forced=None):
    """Each worker thread's ring, `connect`ed while claiming machine
    `machines[rank]` (a letter each), with `KERAS_REPLICATOR_RING_HIERARCHY` set
    to `grid` (None: unset) and `connect`'s `grid=forced`."""
    if grid is None:
        monkeypatch.delenv(_hierarchical.ENVIRONMENT_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(_hierarchical.ENVIRONMENT_VARIABLE, grid)
    claimed = threading.local()
    monkeypatch.setattr(_setup, "machine_key", lambda: [float(claimed.machine), 0.0])
    exchange = _Exchange(len(machines))
    rings, errors = [None] * len(machines), []

    def work(rank):
        claimed.machine = ord(machines[rank])
        try:
            rings[rank] = _socket_ring.SocketRing.connect(
                _Worker(exchange, rank), timeout=5, bucket_bytes=1 << 20, grid=forced
            )
        except Exception as error:  # noqa: BLE001 - checked below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(len(machines))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return rings


def test_connect_puts_each_machines_workers_next_to_each_other(
    threads_as_workers,  # noqa: F811 - the fixture
    monkeypatch,
):
    rings = connect_on_machines("ABAB", monkeypatch, grid="0")  # TF_CONFIG: h1 h2 h1 h2
    inputs = [np.arange(40, dtype=np.float32) * (r + 1) for r in range(4)]
    results = _on_every_worker(
        dict(enumerate(rings)), lambda r, ring: ring.reduce_scatter(inputs[r])
    )
    assert [ring.order for ring in rings] == [[0, 2, 1, 3]] * 4
    assert [ring.replica for ring in rings] == [0, 1, 2, 3]
    assert [ring.rank for ring in rings] == [0, 2, 1, 3]  # positions
    total = sum(inputs)
    for rank, chunk in results.items():
        np.testing.assert_array_equal(chunk, total[rank * 10 : (rank + 1) * 10])
    # Shared memory: one process here, so every link could map its neighbour's.
    if os.environ.get("KERAS_REPLICATOR_RING_SHARED_MEMORY", "1") != "0":
        assert all(ring._link.inbox is not None for ring in rings)
