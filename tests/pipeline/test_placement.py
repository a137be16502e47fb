"""Several replicas per worker (GPU workers): each runs its stages on its own GPUs.

TF's multi-worker and mirrored strategies make one replica per local GPU. GPipe
used to put every replica's stage k on `devices[k]`, as with one replica per
worker (issue 48, item 13). Proved on CPU: the GPU flavour is traced with GPU
device strings (nothing runs), and trained with the platform set to GPU on
logical CPU replicas.
"""

import collections

import keras
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator._replicator_state import replicator_state
from keras_replicator.pipeline import GPipe
from tests.pipeline import _models

FOUR_GPUS = ["/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"]


def _matmul_devices_per_replica(strategy, pipe):
    """{replica: sorted device names of its MatMuls} in a traced training step."""

    @tf.function
    def step(x):
        return strategy.run(lambda batch: pipe(batch, training=True), args=(x,))

    graph = step.get_concrete_function(tf.TensorSpec([8, 6])).graph
    devices = collections.defaultdict(set)
    for op in graph.get_operations():
        if op.type == "MatMul":
            scope = op.name.split("/")[0]
            replica = (
                int(scope[len("replica_") :]) if scope.startswith("replica_") else 0
            )
            spec = tf.DeviceSpec.from_string(op.device)
            devices[replica].add(f"{spec.device_type}:{spec.device_index}")
    return {replica: sorted(names) for replica, names in devices.items()}


def test_two_gpu_replicas_run_their_stages_on_gpus_of_their_own():
    strategy = kr.MultiDeviceReplicator(devices=["/gpu:0", "/gpu:1"])
    with strategy.scope():
        pipe = GPipe(
            _models.mlp(), balance=[2, 1], checkpoint="never", devices=FOUR_GPUS
        )
    assert pipe.devices == ["/gpu:0", "/gpu:2"]
    # Stage 0 on the replica's own GPU, stage 1 on a spare one; no GPU shared.
    assert _matmul_devices_per_replica(strategy, pipe) == {
        0: ["GPU:0", "GPU:2"],
        1: ["GPU:1", "GPU:3"],
    }


def test_one_stage_runs_on_each_replicas_own_gpu():
    strategy = kr.MultiDeviceReplicator(devices=["/gpu:0", "/gpu:1"])
    with strategy.scope():
        pipe = GPipe(_models.mlp(), balance=[3], devices=["/gpu:0", "/gpu:1"])
    assert _matmul_devices_per_replica(strategy, pipe) == {0: ["GPU:0"], 1: ["GPU:1"]}


def _one_replica_per_gpu_worker():
    # What `kr.MultiWorkerReplicator()` makes on a worker with 2 GPUs: TF's
    # multi-worker strategy takes the GPU count from the cluster resolver.
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({}), num_accelerators={"GPU": 2}
    )
    return kr.MultiWorkerReplicator(cluster_resolver=resolver)


@pytest.mark.parametrize(
    "make_strategy",
    [
        lambda: kr.MultiDeviceReplicator(devices=["/gpu:0", "/gpu:1"]),
        _one_replica_per_gpu_worker,
    ],
    ids=["mirrored", "multi-worker"],
)
def test_one_replica_per_gpu_leaves_no_gpu_for_a_second_stage(make_strategy):
    strategy = make_strategy()
    assert strategy.extended.worker_devices[1].endswith("GPU:1")
    with strategy.scope():
        with pytest.raises(ValueError, match="needs 2 devices per replica") as error:
            GPipe(_models.mlp(), balance=[2, 1], devices=["/gpu:0", "/gpu:1"])
    assert "fewer replicas per worker" in str(error.value)


def test_two_replicas_on_gpu_platform_train_like_one_device():
    # Logical CPUs told they are GPUs: the placement runs for real.
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    replicator_state(strategy).platform = "GPU"
    plain = _models.mlp()
    with strategy.scope():
        other = _models.mlp(seed=1)
        other.set_weights(plain.get_weights())
        pipe = GPipe(other, balance=[2, 1], num_microbatches=2, checkpoint="always")
    assert pipe.devices == ["/cpu:0", "/cpu:2"]  # replica 1: /cpu:1, /cpu:3
    x, y = _models.data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    keras.utils.set_random_seed(0)
    plain.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    plain.fit(dataset, epochs=2, verbose=0)
    with strategy.scope():
        pipe.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    pipe.fit(dataset, epochs=2, verbose=0)
    assert _models.max_difference(plain.get_weights(), pipe.get_weights()) < 1e-5
