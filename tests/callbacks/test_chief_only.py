import sys
import textwrap

import keras
import pytest

from keras_replicator.callbacks.chief_only import ChiefOnly
from keras_replicator.launch import run_workers
from keras_replicator.testing import _workloads as w


class _Counter(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.events = 0

    def on_train_batch_end(self, batch, logs=None):
        self.events += 1

    def on_epoch_end(self, epoch, logs=None):
        self.events += 1


def test_forwards_everything_on_a_single_process():
    counter = _Counter()
    model = w.mlp()
    x, y = w.classification_data(128)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=[ChiefOnly(counter)])
    assert counter.events == 3
    assert counter.model is model


def test_a_non_chief_never_gives_the_callback_the_model():
    # TensorBoard writes the model graph in `set_model`, before any event.
    import types

    extended = types.SimpleNamespace(should_checkpoint=False)
    strategy = types.SimpleNamespace(extended=extended)
    model = types.SimpleNamespace(distribute_strategy=strategy)
    counter = _Counter()
    ChiefOnly(counter).set_model(model)
    assert counter.model is None


def test_rejects_non_callbacks():
    with pytest.raises(TypeError, match="keras.callbacks.Callback"):
        ChiefOnly(print)


NON_CHIEF = textwrap.dedent(
    """
    import os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras
    import keras_replicator as kr
    from keras_replicator.callbacks.chief_only import ChiefOnly
    from keras_replicator.testing import _workloads as w

    strategy = kr.MultiWorkerReplicator(collective_timeout=120)

    class Say(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print("EPOCH END", epoch)

    with strategy.scope():
        model = w.mlp()
    x, y = w.classification_data(256)
    model.fit(x, y, batch_size=64, epochs=2, verbose=1, callbacks=[ChiefOnly(Say())])
    """
)


@pytest.mark.slow(
    reason="covered in the default run by: "
    "test_a_non_chief_never_gives_the_callback_the_model; the chief's "
    "progress bar alone on 2 workers: test_cross_replica_metrics.py::"
    "test_unequal_worker_shards_log_the_one_device_numbers; "
    "tests/testing/test_conformance.py::test_multi_worker_strategy_passes"
)
@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_only_the_chief_runs_it_and_draws_a_progress_bar():
    result = run_workers([sys.executable, "-c", NON_CHIEF], 2, timeout=240)
    assert result.ok, result.describe_failure()
    chief, other = (w.output for w in result.workers)
    assert "EPOCH END 1" in chief and "EPOCH END" not in other
    assert "/step" in chief and "/step" not in other
