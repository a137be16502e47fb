import json
import sys
import textwrap

import keras
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.callbacks.cross_replica_metrics import CrossReplicaMetrics
from keras_replicator.launch import run_workers
from keras_replicator.testing import _workloads as w


class _Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.train, self.test = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.train.append(dict(logs))

    def on_test_batch_end(self, batch, logs=None):
        self.test.append(dict(logs))


def _run(strategy, initial, callbacks):
    x, y = w.classification_data(1001)
    with strategy.scope():
        model = w.mlp()
    model.set_weights(initial)
    recorder = _Recorder()
    model.fit(
        x,
        y,
        batch_size=64,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[*callbacks, recorder],
    )
    model.evaluate(x, y, batch_size=48, verbose=0, callbacks=[*callbacks, recorder])
    return recorder


def test_every_step_log_equals_one_device_on_4_replicas():
    keras.utils.set_random_seed(0)
    initial = w.mlp().get_weights()
    reference = _run(tf.distribute.get_strategy(), initial, [])
    ours = _run(
        kr.MultiDeviceReplicator(num_replicas=4),
        initial,
        [CrossReplicaMetrics(every_n_steps=1)],
    )
    for got, want in zip(ours.train + ours.test, reference.train + reference.test):
        for key in ("loss", "accuracy"):
            assert got[key] == pytest.approx(want[key], abs=1e-5)


def test_cadence_picks_every_nth_call():
    from keras_replicator.keras_integration import _global_metrics

    model = w.mlp()
    _global_metrics.set_cadence(model, "train", 3)
    assert [_global_metrics.due(model, "train") for _ in range(7)] == [
        False,
        False,
        True,
        False,
        False,
        True,
        False,
    ]
    assert not _global_metrics.due(model, "test")
    _global_metrics.set_cadence(model, "train", None)
    assert not _global_metrics.due(model, "train")


def test_stock_strategy_is_a_clear_error():
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = w.mlp()
    x, y = w.classification_data(64)
    with pytest.raises(ValueError, match="needs a keras_replicator strategy"):
        model.fit(x, y, verbose=0, callbacks=[CrossReplicaMetrics()])


@pytest.mark.parametrize("bad, error", [(0, ValueError), (2.5, TypeError)])
def test_bad_cadence(bad, error):
    with pytest.raises(error, match="every_n_steps"):
        CrossReplicaMetrics(every_n_steps=bad)


UNEQUAL_SHARDS = textwrap.dedent(
    """
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras, numpy as np, tensorflow as tf
    import keras_replicator as kr
    from keras_replicator.callbacks.cross_replica_metrics import CrossReplicaMetrics
    from keras_replicator.testing import _workloads as w

    strategy = kr.MultiWorkerReplicator(collective_timeout=120)
    worker = int(os.environ["KERAS_REPLICATOR_WORKER_INDEX"])
    x, y = w.classification_data(1001)
    shards = [(x[:600], y[:600]), (x[600:], y[600:])]  # 600 vs 401 samples

    def input_fn(context):
        sx, sy = shards[context.input_pipeline_id]
        return tf.data.Dataset.from_tensor_slices((sx, sy)).batch(32)

    keras.utils.set_random_seed(0)
    reference = w.mlp()
    with strategy.scope():
        model = w.mlp()
    model.set_weights(reference.get_weights())

    class Last(keras.callbacks.Callback):
        logs = {}
        def on_test_batch_end(self, batch, logs=None):
            Last.logs = dict(logs)

    data = strategy.distribute_datasets_from_function(input_fn)
    plain = model.evaluate(data, verbose=0, return_dict=True, callbacks=[Last()])
    plain_last = Last.logs
    data = strategy.distribute_datasets_from_function(input_fn)
    result = model.evaluate(
        data, verbose=0, return_dict=True,
        callbacks=[CrossReplicaMetrics(every_n_steps=1), Last()],
    )
    single = reference.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
    data = strategy.distribute_datasets_from_function(input_fn)
    model.fit(data, epochs=1, verbose=1, callbacks=[CrossReplicaMetrics(5)])
    print("RESULT " + json.dumps({
        "last_step": Last.logs, "returned": result, "single": single,
        "plain_last_step": plain_last, "plain_returned": plain,
    }))
    """
)


@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_unequal_worker_shards_log_the_one_device_numbers():
    result = run_workers([sys.executable, "-c", UNEQUAL_SHARDS], 2, timeout=240)
    assert result.ok, result.describe_failure()
    reports = []
    for worker in result.workers:
        line = next(x for x in worker.output.splitlines() if x.startswith("RESULT "))
        reports.append(json.loads(line[len("RESULT ") :]))
    for report in reports:
        for key in ("loss", "accuracy"):
            assert report["last_step"][key] == pytest.approx(
                report["single"][key], abs=1e-5
            )
            assert report["returned"][key] == pytest.approx(
                report["single"][key], abs=1e-5
            )
    assert reports[0]["last_step"] == reports[1]["last_step"]
    # Only the chief draws a progress bar.
    assert "/step" in result.workers[0].output
    assert "/step" not in result.workers[1].output
