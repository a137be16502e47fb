"""The GPU paths of the gradient communication, proved on a CPU by construction.

No GPU here: each test builds a step in a `tf.Graph()` under strategies whose
replicas are GPU device strings (`/gpu:0`, `/gpu:1`, ...), without running it,
and reads the collective ops TensorFlow would run. A collective on a GPU must be
NCCL's: hinted `"nccl"` (TensorFlow runs RING for `"auto"`, and finds no
reduce-scatter at all), on a dtype TensorFlow's NCCL wrapper sums
(`_platform.NCCL_DTYPES`). Combinations that cannot work are refused before the
first step. docs/accelerators.md says what is proved here and what is not.
"""

import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator import _platform
from keras_replicator.communication import _all_reduce, _strategy_transport
from keras_replicator.strategies import multi_worker

GPUS = ["/gpu:0", "/gpu:1"]
FOUR_GPUS = ["/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"]
_COLLECTIVES = ("Collective", "Nccl")


def _collectives(strategy, step):
    """`(type, device, hint, dtype, timeout)` of each collective `step` builds."""
    with tf.Graph().as_default() as graph:
        strategy.run(step)
    found = []
    for op in graph.get_operations():
        if not op.type.startswith(_COLLECTIVES):
            continue
        attrs = op.node_def.attr
        hint = (
            op.get_attr("communication_hint") if "communication_hint" in attrs else b""
        )
        timeout = op.get_attr("timeout_seconds") if "timeout_seconds" in attrs else None
        found.append((op.type, op.device, hint.decode(), op.get_attr("T"), timeout))
    return found


def _assert_nccl(found):
    assert found, "the step built no collective"
    for kind, device, hint, dtype, _ in found:
        assert _platform.device_platform(device) == _platform.GPU, (kind, device)
        assert hint == "nccl", f"{kind} on {device} is hinted {hint!r}"
        assert dtype in _platform.NCCL_DTYPES, f"{kind} on {device} sums {dtype}"


def _gradient_step(options=None):
    def step():
        gradients = [tf.ones([5]), tf.ones([3, 2])]
        return _all_reduce.all_reduce_sum(
            gradients, exact=[tf.constant(1.0)], options=options
        )

    return step


def _multi_device(devices, **options):
    return kr.MultiDeviceReplicator(
        devices=devices, all_reduce=kr.AllReduceOptions(**options)
    )


@pytest.mark.parametrize(
    "devices, options",
    [
        (GPUS, dict(hierarchy="2d")),
        (GPUS, dict(hierarchy="local_then_global")),
        (FOUR_GPUS, dict(hierarchy="2d", group_size=2)),
        (FOUR_GPUS, dict(hierarchy="local_then_global", group_size=2)),
        (GPUS, dict(hierarchy="2d", compression="fp16")),
    ],
    ids=["2d", "local_then_global", "2d-grid", "local_then_global-grid", "2d-fp16"],
)
def test_every_hierarchical_collective_on_a_gpu_is_nccl(devices, options):
    found = _collectives(_multi_device(devices, **options), _gradient_step())
    _assert_nccl(found)
    if options["hierarchy"] == "2d":
        assert "CollectiveReduceScatterV2" in {kind for kind, *_ in found}


def test_a_stock_mirrored_strategy_gets_nccl_hierarchies_too():
    strategy = tf.distribute.MirroredStrategy(devices=GPUS)
    options = kr.AllReduceOptions(hierarchy="2d", transport="collective")
    _assert_nccl(_collectives(strategy, _gradient_step(options)))


def _reduce_scatter_step(strategy, columns=3):
    def step():
        context = tf.distribute.get_replica_context()
        options = _strategy_transport.options_of(strategy)
        transport = _strategy_transport.transport_for(strategy, options)
        matrix = tf.ones([context.num_replicas_in_sync, columns])
        return transport.reduce_scatter(matrix)

    return step


@pytest.mark.parametrize("devices", [GPUS, FOUR_GPUS], ids=["2", "4"])
def test_sharded_update_reduce_scatters_with_nccl_not_an_all_reduce(devices):
    strategy = _multi_device(devices, shard_weight_update=True)
    found = _collectives(strategy, _reduce_scatter_step(strategy))
    _assert_nccl(found)
    kinds = [kind for kind, *_ in found]
    # One reduce-scatter per replica, and no all-reduce of the whole matrix.
    assert kinds.count("CollectiveReduceScatterV2") == len(devices)
    assert "CollectiveReduceV2" not in kinds
    # The rank-order gather of replica ids: one float per replica.
    assert kinds.count("CollectiveGatherV2") == len(devices)
    with tf.Graph().as_default():  # each replica gets a static [columns] row
        rows = strategy.run(_reduce_scatter_step(strategy, columns=7))
        shapes = {tuple(v.shape) for v in strategy.experimental_local_results(rows)}
    assert shapes == {(7,)}


def test_bf16_on_gpus_is_refused_at_construction_naming_fp16():
    with pytest.raises(ValueError, match="compression='fp16'") as error:
        _multi_device(GPUS, compression="bf16")
    assert "Received: compression='bf16'" in str(error.value)
    # ... and fp16 builds NCCL float16 buckets.
    _assert_nccl(
        _collectives(_multi_device(GPUS, compression="fp16"), _gradient_step())
    )


def test_bf16_on_a_stock_gpu_strategy_is_refused_when_the_step_is_built():
    strategy = tf.distribute.MirroredStrategy(devices=GPUS)
    options = kr.AllReduceOptions(compression="bf16")
    with pytest.raises(ValueError, match="compression='fp16'"):
        _collectives(strategy, _gradient_step(options))


def _gpu_resolver(gpus=2):
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({}), num_accelerators={"GPU": gpus}
    )


def test_multi_worker_bf16_on_gpu_workers_is_refused_at_construction():
    with pytest.raises(ValueError, match="compression='fp16'"):
        kr.MultiWorkerReplicator(
            cluster_resolver=_gpu_resolver(),
            all_reduce=kr.AllReduceOptions(compression="bf16"),
        )


def test_the_socket_ring_is_refused_on_gpu_workers():
    with pytest.raises(ValueError, match="CPU workers") as error:
        kr.MultiWorkerReplicator(
            cluster_resolver=_gpu_resolver(gpus=1),
            all_reduce=kr.AllReduceOptions(transport="socket"),
        )
    assert "Received: transport='socket' on GPU workers" in str(error.value)


def test_communication_options_nccl_without_timeout_on_gpus_as_before_on_cpus():
    implementations = tf.distribute.experimental.CommunicationImplementation
    gpu = multi_worker.communication_options_for(None, None, _platform.GPU)
    assert gpu.implementation == implementations.NCCL
    assert gpu.timeout_seconds is None
    cpu = multi_worker.communication_options_for(None, None, _platform.CPU)
    assert cpu.implementation == implementations.AUTO
    assert cpu.timeout_seconds == multi_worker.DEFAULT_COLLECTIVE_TIMEOUT == 60.0
    # What the user asks for is kept: an implementation, a timeout, a pack size.
    asked = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=1024, implementation=implementations.RING
    )
    kept = multi_worker.communication_options_for(asked, 30.0, _platform.GPU)
    assert kept.implementation == implementations.RING
    assert (kept.timeout_seconds, kept.bytes_per_pack) == (30.0, 1024)
    timed = tf.distribute.experimental.CommunicationOptions(timeout_seconds=5.0)
    assert (
        multi_worker.communication_options_for(timed, None, _platform.GPU)
    ).timeout_seconds == 5.0


def _all_reduce_step():
    context = tf.distribute.get_replica_context()
    return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([4]))


def test_multi_worker_constructor_builds_nccl_collectives_without_timeout_on_gpus():
    strategy = kr.MultiWorkerReplicator(cluster_resolver=_gpu_resolver())
    found = _collectives(strategy, _all_reduce_step)
    _assert_nccl(found)
    assert {timeout for *_, timeout in found} == {0.0}
    # The hierarchy's own collectives: NCCL, no timeout either.
    options = kr.AllReduceOptions(hierarchy="2d", transport="collective")
    found = _collectives(strategy, _gradient_step(options))
    _assert_nccl(found)
    assert {timeout for *_, timeout in found} == {0.0}
    # An explicit timeout is kept (TensorFlow's debugging aid).
    timed = kr.MultiWorkerReplicator(
        cluster_resolver=_gpu_resolver(), collective_timeout=20
    )
    assert {t for *_, t in _collectives(timed, _all_reduce_step)} == {20.0}


def test_multi_worker_constructor_keeps_the_cpu_collectives():
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({})
    )
    strategy = kr.MultiWorkerReplicator(cluster_resolver=resolver)
    # One CPU replica builds no collective to read: the parent's options (the
    # private attribute its collectives merge every call's options into).
    options = strategy.extended._communication_options
    assert options.implementation.value == "AUTO"
    assert options.timeout_seconds == 60.0
    assert multi_worker.local_platform(resolver) == _platform.CPU
    assert multi_worker.local_platform(_gpu_resolver()) == _platform.GPU


def _one_gpu_split_in_two(monkeypatch):
    """TensorFlow's view after `num_replicas=2` on a 1-GPU machine: 1 physical
    GPU, 2 logical ones (faked at tf.config, where `_platform` reads them)."""
    listed = {"GPU": ["/physical_device:GPU:0"]}
    logical = {"GPU": ["/device:GPU:0", "/device:GPU:1"]}
    real_physical = tf.config.list_physical_devices
    real_logical = tf.config.list_logical_devices
    monkeypatch.setattr(
        tf.config,
        "list_physical_devices",
        lambda kind=None: listed[kind] if kind == "GPU" else real_physical(kind),
    )
    monkeypatch.setattr(
        tf.config,
        "list_logical_devices",
        lambda kind=None: logical[kind] if kind == "GPU" else real_logical(kind),
    )


def test_logical_gpus_split_from_one_keep_tensorflows_ring(monkeypatch):
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); TF's own
    # MirroredStrategy keeps RING on virtual GPUs, and so do our collectives.
    _one_gpu_split_in_two(monkeypatch)
    strategy = _multi_device(GPUS, shard_weight_update=True, compression="bf16")
    assert not _platform.nccl_usable(strategy)
    found = _collectives(strategy, _reduce_scatter_step(strategy))
    kinds = [kind for kind, *_ in found]
    # No reduce-scatter (RING has none): an all-reduce and a slice, through
    # the strategy's own collectives (TF picks RING for virtual GPUs itself,
    # from its runtime's device list, which this fake does not reach).
    assert "CollectiveReduceScatterV2" not in kinds
    assert "CollectiveReduceV2" in kinds
    hierarchy = _multi_device(GPUS, hierarchy="2d")
    found = _collectives(hierarchy, _gradient_step())
    assert found and {hint for _, _, hint, *_ in found} == {"auto"}


def test_workers_sharing_gpus_keep_ring_and_its_timeout(monkeypatch):
    # `keras-replicator launch -n 2` on one GPU shares it and says so.
    monkeypatch.setenv("KERAS_REPLICATOR_SHARED_GPUS", "1")
    strategy = kr.MultiWorkerReplicator(
        cluster_resolver=_gpu_resolver(gpus=1),
        all_reduce=kr.AllReduceOptions(compression="bf16"),
    )
    options = strategy.extended._communication_options
    assert options.implementation.value == "AUTO"
    assert options.timeout_seconds == 60.0
    assert not _platform.nccl_usable(strategy)


def _ordering_tokens(strategy, step):
    """`{(op type, device): ordering-token tensor}` of the NCCL collectives a
    traced `tf.function` step builds (TF gives its own an ordering token only
    there, not in a TF1-style graph)."""
    graph = tf.function(lambda: strategy.run(step)).get_concrete_function().graph
    tokens = {}
    for op in graph.get_operations():
        if op.type.startswith("Collective") and op.get_attr("Nordering_token"):
            tokens.setdefault(op.device, set()).add((op.type, op.inputs[-1].ref()))
    return tokens


def test_our_nccl_collectives_share_each_devices_ordering_chain_with_tfs():
    # NCCL needs one launch order per device; TF orders its own by one token
    # per device. Ours (the reduce-scatter) and the strategy's (the all-gather
    # of the sharded update) must hang on the same token, or two devices may
    # launch them in different orders and wait for each other for good.
    strategy = _multi_device(GPUS, shard_weight_update=True)

    def step():
        transport = _strategy_transport.transport_for(strategy, kr.AllReduceOptions())
        row = transport.reduce_scatter(tf.ones([2, 3]))
        return transport.all_gather(row)

    tokens = _ordering_tokens(strategy, step)
    assert len(tokens) == len(GPUS)
    for device, found in tokens.items():
        kinds = {kind for kind, _ in found}
        assert {"CollectiveReduceScatterV2", "CollectiveGatherV2"} <= kinds, kinds
        assert len({token for _, token in found}) == 1, (device, found)
