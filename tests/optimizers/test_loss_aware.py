"""`fit` hands NLCG the global-batch loss, on one device and under every strategy.

Also where both large-batch optimizers meet the Replicators in `fit`: compression,
`ReplicaConsistencyCheck` and 2 worker processes (uneven last batch).

The loss reaches the optimizer through the public `optimizer.scale_loss`, which
Keras' train step calls (NLCG overrides it, `_loss_aware.observe_scaled_loss`;
nothing is patched). With `loss_smoothing=0` the
optimizer's loss average after each step *is* the loss it was handed, so the
tests compare that too, not only the weights. Losses are computed in float64
(`floatx`), so the global mean of the replicas' means must equal the one-device
mean to the last bits.
"""

import keras
import numpy as np
import pytest

import keras_replicator as kr
from keras_replicator import _compat
from keras_replicator.optimizers import NLCG
from tests.optimizers import _fit_helpers
from tests.optimizers._numpy_nlcg import NumpyNLCG


def _regression_data(num_samples=50, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_samples, 4))
    y = x @ rng.normal(size=(4, 1)) + 0.5 * rng.normal(size=(num_samples, 1))
    return x, y


def test_fit_on_one_device_matches_the_numpy_transcription(float64):
    x, y = _regression_data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(NLCG(0.3, step_control_period=2), "mse", jit_compile=False)
    initial = model.get_weights()
    # Validation inside `fit` computes losses too: they must not reach NLCG.
    model.fit(
        x,
        y,
        batch_size=16,  # 16, 16, 16, 2
        epochs=3,
        shuffle=False,
        verbose=0,
        validation_data=(x[:10], y[:10]),
    )
    reference = NumpyNLCG(initial, lr=0.3, period=2)
    for _ in range(3):
        for start in range(0, len(x), 16):
            xb, yb = x[start : start + 16], y[start : start + 16]
            kernel, bias = reference.weights()
            residual = xb @ kernel + bias - yb
            grads = [2 * xb.T @ residual / len(xb), 2 * residual.sum(0) / len(xb)]
            reference.apply(grads, float(np.mean(residual**2)))
    _fit_helpers.assert_weights_close(model.get_weights(), reference.weights(), 1e-12)
    np.testing.assert_allclose(
        float(model.optimizer.step_multiplier.numpy()), reference.c, rtol=1e-12
    )
    cuts = [band for _, band in reference.bands if band != "grow"]
    assert cuts and reference.c < 1.0  # the step control did act on the losses


def _run(strategy, num_samples, **kwargs):
    result = _fit_helpers.recorded_fit(strategy, "nlcg", num_samples, **kwargs)
    return result["weights"], result["seen"], result["multipliers"]


def _assert_weights_close(a, b, atol):
    _fit_helpers.assert_weights_close(
        [np.asarray(w) for w in a], [np.asarray(w) for w in b], atol
    )


@keras.saving.register_keras_serializable(package="kr_tests")
class _CustomStep(_fit_helpers.LossObservingModel):
    pass


def test_fit_hands_the_loss_a_custom_train_step_hands(float64):
    weights, seen, multipliers = _run(None, 100)
    x, y = _fit_helpers.data(100)
    net = _fit_helpers.model(_fit_helpers.OPTIMIZERS["nlcg"], model_class=_CustomStep)
    net.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
    _assert_weights_close(weights, net.get_weights(), atol=0)
    assert min(multipliers) < 1.0 and len(seen) == 12


@pytest.mark.parametrize(
    "make_strategy, num_samples",
    [
        # An uneven last batch (100 = 3 x 32 + 4): exact under our strategies.
        (lambda: kr.MultiDeviceReplicator(num_replicas=2), 100),
        # Stock Keras weighs an uneven split inexactly (its gradient, not our
        # loss), so the stock strategy gets even batches. Its own collective keys:
        # float64 all-reduces at stock's shared instance keys aborted the float32
        # ones of every later stock strategy in the test session.
        (lambda: _compat.stock_mirrored_strategy(["/cpu:0", "/cpu:1"]), 192),
    ],
    ids=["multi_device_replicator", "mirrored_strategy"],
)
def test_fit_under_a_strategy_hands_the_one_device_loss(
    float64, make_strategy, num_samples
):
    one = _run(None, num_samples)
    check = kr.callbacks.ReplicaConsistencyCheck(every_n_steps=1)
    many = _run(make_strategy(), num_samples, callbacks=[check])
    _assert_weights_close(one[0], many[0], atol=1e-10)
    np.testing.assert_allclose(many[1], one[1], rtol=1e-13)
    assert one[2] == many[2] and min(one[2]) < 1.0


@pytest.mark.slow(
    reason="covered in the default run by: "
    "communication/test_all_reduce.py compressed wire"
)
@pytest.mark.parametrize("optimizer", ["nlcg", "neumann"])
def test_compressed_all_reduce_keeps_replicas_identical(float64, optimizer):
    # bf16 on the wire changes the gradients, not the loss handed to NLCG (its
    # all-reduce is separate), nor the agreement of the replicas.
    strategy = kr.MultiDeviceReplicator(
        num_replicas=2, all_reduce=kr.AllReduceOptions(compression="bf16")
    )
    check = kr.callbacks.ReplicaConsistencyCheck(every_n_steps=1)
    one = _fit_helpers.recorded_fit(None, optimizer, 100)
    many = _fit_helpers.recorded_fit(strategy, optimizer, 100, callbacks=[check])
    if optimizer == "nlcg":
        assert many["seen"][0] == pytest.approx(one["seen"][0], rel=1e-13)
    gaps = [
        np.max(np.abs(np.asarray(a) - np.asarray(b)))
        for a, b in zip(one["weights"], many["weights"])
    ]
    assert 0 < max(gaps) < 0.05, gaps


@pytest.mark.multi_worker
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "optimizer",
    [
        pytest.param(
            "nlcg",
            marks=pytest.mark.slow(
                reason="covered in the default run by: "
                "test_fit_under_a_strategy_hands_the_one_device_loss"
                "[multi_device_replicator] (an uneven last batch, exact); "
                "tests/testing/test_conformance.py::test_multi_worker_strategy_passes"
            ),
        ),
        pytest.param(
            "neumann",
            marks=pytest.mark.slow(
                reason="covered in the default run by: "
                "the same test [nlcg]; test_neumann_resume.py"
            ),
        ),
    ],
)
def test_fit_on_two_workers_trains_as_one_device(float64, optimizer):
    num_samples = 101  # the last batch (5) splits unevenly over the workers
    initial = _fit_helpers.model(_fit_helpers.OPTIMIZERS[optimizer]).get_weights()
    one = _fit_helpers.recorded_fit(
        None, optimizer, num_samples, initial=initial, epochs=2
    )
    for got in _fit_helpers.fit_on_workers(optimizer, initial, num_samples, 2):
        _assert_weights_close(one["weights"], got["weights"], atol=1e-10)
        np.testing.assert_allclose(got["seen"], one["seen"], rtol=1e-13)
        assert got["multipliers"] == one["multipliers"]
    if optimizer == "nlcg":
        assert min(one["multipliers"]) < 1.0
