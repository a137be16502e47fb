import sys
import textwrap

import keras
import pytest

import keras_replicator as kr
from keras_replicator.callbacks.throughput import Throughput
from keras_replicator.keras_integration import _sample_counter
from keras_replicator.launch import run_workers
from keras_replicator.testing import _workloads as w


class _Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches, self.epochs = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(dict(logs))

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))


def test_logs_examples_per_second_on_replicas():
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    with strategy.scope():
        model = w.mlp()
    x, y = w.classification_data(1024)
    recorder = _Recorder()
    model.fit(
        x,
        y,
        batch_size=64,
        epochs=2,
        verbose=0,
        callbacks=[Throughput(every_n_steps=4), recorder],
    )
    measured = [b for b in recorder.batches if "examples_per_second" in b]
    assert len(measured) == 8  # 16 batches per epoch, every 4th, 2 epochs
    for logs in measured:
        assert logs["examples_per_second"] > 0
        assert logs["examples_per_second_per_replica"] == pytest.approx(
            logs["examples_per_second"] / 2
        )
        assert logs["step_seconds"] > 0
    assert all(e["examples_per_second"] > 0 for e in recorder.epochs)


def test_samples_are_counted_only_for_a_fit_that_asks():
    # Issue 36: the counter is a variable whose creation is a cross-worker
    # broadcast in every `fit`'s first step; only `Throughput` needs it.
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    with strategy.scope():
        model = w.mlp()
    x, y = w.classification_data(200)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    assert _sample_counter.samples_seen(model) is None
    # The next `fit` asks: its (cached) train function is rebuilt, counting.
    throughput = Throughput(every_n_steps=2)
    model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=[throughput])
    assert throughput._samples() == 2 * 200  # a short last batch counts its 8


def test_one_device_counts_batches_of_the_given_size():
    model = w.mlp()
    x, y = w.classification_data(1024)
    recorder = _Recorder()
    throughput = Throughput(every_n_steps=4, batch_size=64)
    model.fit(
        x, y, batch_size=64, epochs=2, verbose=0, callbacks=[throughput, recorder]
    )
    assert throughput._samples() == 2 * 1024
    assert all(e["examples_per_second"] > 0 for e in recorder.epochs)


def test_one_device_without_batch_size_is_a_clear_error():
    model = w.mlp()
    x, y = w.classification_data(64)
    with pytest.raises(ValueError, match="batch_size=None"):
        model.fit(x, y, batch_size=64, verbose=0, callbacks=[Throughput()])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"every_n_steps": 0}, "every_n_steps"),
        ({"straggler_ratio": 1.0}, "ratio"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Throughput(**kwargs)


STRAGGLER = textwrap.dedent(
    """
    import os, time, warnings
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras
    import keras_replicator as kr
    from keras_replicator.callbacks.throughput import Throughput
    from keras_replicator.testing import _workloads as w

    strategy = kr.MultiWorkerReplicator(collective_timeout=120)
    worker = int(os.environ["KERAS_REPLICATOR_WORKER_INDEX"])

    class SlowHost(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if worker == 1:
                time.sleep(0.05)  # slow Python work on worker 1 only

    with strategy.scope():
        model = w.mlp()
    x, y = w.classification_data(1024)
    throughput = Throughput(every_n_steps=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=64, epochs=1, verbose=0,
                  callbacks=[SlowHost(), throughput])
    print("STRAGGLERS", sorted(set(throughput.stragglers)), len(throughput.stragglers))
    print("WARNED", any("Worker 1 is a straggler" in str(c.message) for c in caught))
    """
)


@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_a_slow_worker_is_named():
    result = run_workers([sys.executable, "-c", STRAGGLER], 2, timeout=240)
    assert result.ok, result.describe_failure()
    chief, other = (w.output for w in result.workers)
    for output in (chief, other):  # 4 windows; the first may include tracing
        line = next(x for x in output.splitlines() if x.startswith("STRAGGLERS"))
        assert line.startswith("STRAGGLERS [1] ") and int(line.split()[-1]) >= 3
    assert "WARNED True" in chief
    assert "WARNED False" in other  # only the chief prints the warning
