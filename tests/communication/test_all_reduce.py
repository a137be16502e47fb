"""The gradient communication layer: buckets and wire compression are transparent.

Transparency (torchgpipe's test_transparency): under every `kr.AllReduceOptions`
two replicas train to the weights of one device, exactly in float64 for lossless
options, within a stated tolerance for 16-bit wires.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.communication import (
    _all_reduce,
    _buckets,
    _compression,
    _socket_transport,
)
from keras_replicator.communication._collective_transport import CollectiveTransport
from keras_replicator.communication._socket_transport import SocketTransport


def _model():
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        keras.optimizers.SGD(0.1, momentum=0.9),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _train(strategy, initial, x, y):
    with strategy.scope():
        model = _model()
    model.set_weights(initial)
    # 300 samples at batch 64: an uneven last batch (44 = 22 + 22).
    model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(300, 6)), rng.integers(0, 3, 300)


# bucket_mb=0.0005 (500 bytes) puts each weight of this small net in its own bucket
# or a few together: several collectives a step.
LOSSLESS = [
    kr.AllReduceOptions(),
    kr.AllReduceOptions(bucket_mb=0),
    pytest.param(
        kr.AllReduceOptions(bucket_mb=0.0005),
        marks=pytest.mark.slow(
            reason="covered in the default run by: the same test [default], [one-pack]"
        ),
    ),
]


@pytest.mark.parametrize("options", LOSSLESS, ids=["default", "one-pack", "tiny"])
def test_lossless_options_train_to_the_one_device_weights(float64, options):
    x, y = _data()
    keras.utils.set_random_seed(0)
    initial = _model().get_weights()
    expected = _train(tf.distribute.get_strategy(), initial, x, y)
    got = _train(
        kr.MultiDeviceReplicator(num_replicas=2, all_reduce=options), *(initial, x, y)
    )
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "compression, tolerance",
    [
        pytest.param(
            "bf16",
            2e-2,
            marks=pytest.mark.slow(
                reason="covered in the default run by: the same test [fp16-0.002]"
            ),
        ),
        ("fp16", 2e-3),
    ],
)
def test_compressed_wire_stays_close_to_one_device(compression, tolerance):
    x, y = _data()
    keras.utils.set_random_seed(0)
    initial = _model().get_weights()
    expected = _train(tf.distribute.get_strategy(), initial, x, y)
    options = kr.AllReduceOptions(bucket_mb=0.0005, compression=compression)
    got = _train(
        kr.MultiDeviceReplicator(num_replicas=2, all_reduce=options), *(initial, x, y)
    )
    for e, g in zip(expected, got):
        scale = np.max(np.abs(e))
        np.testing.assert_allclose(g, e, atol=tolerance * scale)
        assert not np.array_equal(g, e) or compression is None


def _times(value, factor):
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(value.values * factor, value.indices, value.dense_shape)
    return value * tf.cast(factor, value.dtype)


def _reduce(strategy, values, exact, options):
    @tf.function
    def step():
        # Not converted by autograph: in the full suite its conversion cache once
        # called this function with `_times`' two arguments (order-dependent).
        @tf.autograph.experimental.do_not_convert
        def replica_fn():
            rid = tf.cast(
                tf.distribute.get_replica_context().replica_id_in_sync_group,
                tf.float32,
            )
            grads = [_times(v, rid + 1.0) for v in values]
            summed, counts = _all_reduce.all_reduce_sum(
                grads, exact=[e * (rid + 1.0) for e in exact], options=options
            )
            return [tf.convert_to_tensor(s) for s in summed], counts

        return strategy.run(replica_fn)

    summed, summed_exact = step()
    local = strategy.experimental_local_results
    return [local(s)[0] for s in summed], [local(e)[0] for e in summed_exact]


def test_fp16_scale_never_overflows_and_counts_stay_exact():
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    big = tf.constant([60000.0, -50000.0, 1.0, 3e-4])  # sum 3x: 180000 > fp16 max
    small = tf.constant([[1e-6, 2e-6]])
    exact = [tf.constant(16777217.0 - 1.0), tf.constant(3.0)]
    # One bucket: small values are resolved relative to the bucket's largest
    # gradient (absolute error ~ 3 * 60000 * 2**-11); separate buckets keep
    # float16's 11 significant bits for each.
    for bucket_mb, atol in ((None, 3 * 60000 * 2.0**-11), (1e-5, 0.0)):
        options = kr.AllReduceOptions(bucket_mb=bucket_mb, compression="fp16")
        summed, counts = _reduce(strategy, [big, small], exact, options)
        assert np.all(np.isfinite(summed[0]))
        np.testing.assert_allclose(summed[0], 3 * big.numpy(), rtol=1e-3, atol=atol)
        np.testing.assert_allclose(summed[1], 3 * small.numpy(), rtol=1e-3, atol=atol)
        assert [float(c) for c in counts] == [3 * 16777216.0, 9.0]


def test_mixed_dtypes_sparse_and_exact_counts_without_compression():
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    values = [
        tf.constant([1.0, 2.0], tf.float16),
        tf.constant([[0.5]], tf.float64),
        tf.constant([3.0]),
        tf.IndexedSlices(
            tf.constant([[2.0, 1.0]]), tf.constant([1]), tf.constant([3, 2])
        ),
    ]
    summed, counts = _reduce(
        strategy, values, [tf.constant(5.0)], kr.AllReduceOptions(bucket_mb=0)
    )
    for v, s in zip(values, summed):
        assert s.dtype == v.dtype
        np.testing.assert_allclose(tf.convert_to_tensor(s), 3 * tf.convert_to_tensor(v))
    assert [float(c) for c in counts] == [15.0]


def test_bucket_plan_is_reverse_layer_order():
    assert _buckets.plan([4, 4, 4, 8], 8) == [[3], [2, 1], [0]]
    assert _buckets.plan([4, 4], 0) == [[1, 0]]
    assert _buckets.plan([], 4) == []
    # Unknown sizes (`None`) travel alone; with one pack, with the others.
    assert _buckets.plan([4, None, 4, 4], 8) == [[3, 2], [1], [0]]
    assert _buckets.plan([4, None], 0) == [[1, 0]]


@pytest.mark.parametrize("bucket_mb", [None, 0], ids=["default", "one-pack"])
def test_tensors_without_a_static_shape_are_summed(bucket_mb):
    # A gradient whose static shape TensorFlow could not infer ("Gradient buckets
    # need static gradient shapes" before, with bucket_mb=0 too).
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    options = kr.AllReduceOptions(bucket_mb=bucket_mb)

    @tf.function(input_signature=[tf.TensorSpec([None, 2])])
    def step(unknown):
        def replica_fn():
            summed, _ = _all_reduce.all_reduce_sum(
                [tf.ones([3]), unknown, tf.ones([2, 2])], options=options
            )
            return summed

        return strategy.run(replica_fn)

    summed = step(tf.reshape(tf.range(6.0), [3, 2]))
    local = [strategy.experimental_local_results(s)[0] for s in summed]
    np.testing.assert_array_equal(local[0], 2 * np.ones(3))
    np.testing.assert_array_equal(local[1], 2 * np.arange(6.0).reshape(3, 2))
    np.testing.assert_array_equal(local[2], 2 * np.ones([2, 2]))


def test_fp16_scale_is_a_power_of_two_within_range():
    for m in (1e-30, 1e-3, 1.0, 65504.0 * 3, 1e30):
        s = float(_compression.scale_for(tf.constant(m)))
        assert s * m <= 2.0**15
        assert s * m >= 2.0**14 or s in (2.0**126, 2.0**-126)
        assert np.log2(s) == int(np.log2(s))
    assert float(_compression.scale_for(tf.constant(np.inf))) == 1.0
    assert float(_compression.scale_for(tf.constant(0.0))) == 1.0


@pytest.mark.slow
def test_compressed_wires_keep_digits_accuracy():
    # A real training run: an MLP on scikit-learn's digits, 30 epochs at batch 64
    # on 2 replicas, from the same initial weights; 16-bit wires must end within
    # 0.5 accuracy points of the float32 wire.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0
    )

    def build():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            keras.optimizers.SGD(0.05, momentum=0.9),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        return model

    keras.utils.set_random_seed(0)
    initial = build().get_weights()
    accuracy = {}
    for compression in (None, "bf16", "fp16"):
        options = kr.AllReduceOptions(compression=compression)
        strategy = kr.MultiDeviceReplicator(num_replicas=2, all_reduce=options)
        with strategy.scope():
            model = build()
        model.set_weights(initial)
        model.fit(x_train, y_train, batch_size=64, epochs=30, shuffle=False, verbose=0)
        accuracy[compression] = model.evaluate(x_test, y_test, verbose=0)[1]
    assert accuracy[None] > 0.9
    assert abs(accuracy["bf16"] - accuracy[None]) <= 0.005, accuracy
    assert abs(accuracy["fp16"] - accuracy[None]) <= 0.005, accuracy
    print(accuracy)


def test_mean_over_replicas_of_mixed_dtypes_on_the_collectives():
    # Step logs of several float dtypes (a float32 metric in a float64 model):
    # TensorFlow's batched MEAN concatenates its values and failed on them.
    strategy = kr.MultiDeviceReplicator(num_replicas=2)

    @tf.function
    def means():
        def replica():
            context = tf.distribute.get_replica_context()
            r = tf.cast(context.replica_id_in_sync_group, tf.float64) + 1.0
            values = [r / 3, tf.cast(r / 7, tf.float32), tf.cast(r, tf.float16)]
            return _all_reduce.mean_over_replicas(values)

        return strategy.run(replica)

    local = [strategy.experimental_local_results(v) for v in means()]
    expected = [(1 / 3 + 2 / 3) / 2, (np.float32(1 / 7) + np.float32(2 / 7)) / 2, 1.5]
    for replicas, value, dtype in zip(
        local, expected, ["float64", "float32", "float16"]
    ):
        assert replicas[0].dtype == dtype
        assert replicas[0].numpy().tobytes() == replicas[1].numpy().tobytes()
        assert replicas[0].numpy() == np.asarray(value, dtype)


class _Ring:
    """Stands for a `SocketRing`: only whether its calls overlap the backward pass."""

    def __init__(self, overlaps):
        self.overlaps = overlaps


def _Overlapping():
    return SocketTransport(_Ring(True))


def _Blocking():
    return SocketTransport(_Ring(False))


MB = 1e6
UNOVERLAPPED_MB = _socket_transport.UNOVERLAPPED_BUCKET_MB


@pytest.mark.parametrize(
    "options, transport, expected",
    [
        (kr.AllReduceOptions(), _Overlapping(), 16 * MB),
        (kr.AllReduceOptions(), _Blocking(), UNOVERLAPPED_MB * MB),
        (kr.AllReduceOptions(bucket_mb=4), _Blocking(), 4 * MB),
        (kr.AllReduceOptions(bucket_mb=16), _Blocking(), 16 * MB),
        (kr.AllReduceOptions(bucket_mb=0), _Blocking(), 0.0),
        (kr.AllReduceOptions(compression="fp16"), _Blocking(), 16 * MB),
    ],
    ids=["overlaps", "blocks", "explicit-4", "explicit-16", "zero", "fp16-scales"],
)
def test_the_default_bucket_follows_whether_calls_can_overlap(
    options, transport, expected
):
    # Buckets pay only where a bucket travels during the backward pass (issue 36).
    assert transport.bucket_bytes(options) == expected


def test_collectives_keep_the_options_bucket():
    options = kr.AllReduceOptions(transport="collective")
    transport = CollectiveTransport(options)
    assert transport.bucket_bytes(options) == 16 * MB


class _Recording(SocketTransport):
    """The socket transport with a ring that counts the gradients of each call
    (one replica: each sum is the value itself)."""

    def __init__(self, overlaps):
        super().__init__(_Ring(overlaps))
        self.calls = []

    def _call(self, function, values, shapes, name, extra=()):
        counts = 1 if function.__name__ == "counted" else 0
        self.calls.append(len(values) - counts)
        return list(values)


@pytest.mark.parametrize(
    "megabytes, overlaps, calls",
    [
        ((8, 8, 8), True, [2, 1]),  # 16 MB buckets
        ((8, 8, 8), False, [3]),  # one call
        ((40, 40, 40), False, [1, 1, 1]),  # capped at 64 MB
    ],
    ids=["overlaps", "blocks", "blocks-large"],
)
def test_the_all_reduce_plans_its_calls_by_the_transport(
    monkeypatch, megabytes, overlaps, calls
):
    transport = _Recording(overlaps)
    monkeypatch.setattr(
        _all_reduce._strategy_transport, "transport_for", lambda *a, **k: transport
    )
    gradients = [tf.zeros([int(mb * MB) // 4]) for mb in megabytes]
    summed, counts = _all_reduce.all_reduce_sum(
        gradients, exact=[tf.constant(4.0)], divide_by_exact=True
    )
    assert transport.calls == calls
    assert len(summed) == 3 and [float(c) for c in counts] == [4.0]
