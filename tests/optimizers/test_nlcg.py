import copy

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.optimizers import (
    NLCG,
    _loss_aware,
    _nlcg_steps,
    observe_loss,
)
from tests.optimizers import _fit_helpers
from tests.optimizers._numpy_nlcg import BANDS, DEFAULT_REVERTED, NumpyNLCG


def _problem(seed=0, num_steps=14):
    rng = np.random.default_rng(seed)
    weights = [rng.normal(size=(4, 3)), rng.normal(size=(3,)), rng.normal(size=(2,))]
    steps = [[rng.normal(size=w.shape) for w in weights] for _ in range(num_steps)]
    return weights, steps


def _variables(weights):
    return [
        keras.Variable(w.astype("float64"), name=f"v{i}") for i, w in enumerate(weights)
    ]


def test_reduces_to_textbook_fletcher_reeves():
    weights, steps = _problem()
    variables = _variables(weights)
    optimizer = NLCG(0.125, preconditioner=None, step_control=False)
    w = [x.copy() for x in weights]
    d_prev, gg_prev = None, None
    for grads in steps:
        optimizer.apply_gradients(zip(grads, variables))
        gg = sum(np.sum(g * g) for g in grads)
        if d_prev is None:
            d = [-g for g in grads]
        else:
            beta = min(max(gg / gg_prev, 0.0), 1.0)
            d = [-g + beta * p for g, p in zip(grads, d_prev)]
        w = [x + 0.125 * di for x, di in zip(w, d)]
        d_prev, gg_prev = d, gg
        for got, want in zip(variables, w):
            np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-15)


# Relative rises of the smoothed loss, one per check: every band of the step
# control (largest first), the exact edge case is avoided, then falls.
RISES = [0.2, 0.14, 0.11, 0.09, 0.06, 0.04, 0.02, 0.0, -0.05, 0.3, -0.1, 0.005]

VARIANTS = {
    "fr_bfgs": {},
    "pr_bfgs": {"beta_rule": "pr"},
    "fr_plain": {"preconditioner": None},
    "pr_plain": {"beta_rule": "pr", "preconditioner": None},
    "fr_bfgs_lars": {"lars_eta": 0.05},
    "pr_bfgs_no_control": {"beta_rule": "pr", "step_control": False},
    "lars_no_control": {"preconditioner": None, "step_control": False, "lars_eta": 0.1},
}


def _loss_for(reference, target, smoothing=0.7):
    """The loss that moves the reference's loss average to `target`."""
    return (target - smoothing * reference.ema) / (1 - smoothing)


def _run(kwargs, period, threshold=1.0, num_steps=None, reverted=None):
    if reverted is not None:
        with _nlcg_steps.timing(reverted):
            return _run(kwargs, period, threshold, num_steps)
    weights, steps = _problem(num_steps=num_steps or len(RISES) * period + 1)
    step_control = kwargs.get("step_control", True)
    variables = _variables(weights)
    optimizer = NLCG(
        0.0625,
        step_control_period=period,
        step_control_threshold=threshold,
        **kwargs,
    )
    reference = NumpyNLCG(
        weights,
        lr=0.0625,
        period=period,
        threshold=threshold,
        beta_rule=kwargs.get("beta_rule", "fr"),
        preconditioner=kwargs.get("preconditioner", "diag_bfgs"),
        step_control=step_control,
        lars_eta=kwargs.get("lars_eta"),
        reverted="".join(k for k, v in _nlcg_steps.AUTHORS_TIMING.items() if not v),
    )
    loss = 2.0
    for step, grads in enumerate(steps):
        if step > 0 and (step + 1) % period == 0:
            # A check compares the average before its own loss: the loss of the
            # step before it sets the rise.
            rise = RISES[(step // period) % len(RISES)]
            loss = _loss_for(reference, reference.ema_old * (1 + rise))
        elif step > 0:
            loss = reference.ema  # flat elsewhere
        if step_control:
            optimizer.set_loss(loss)
        optimizer.apply(grads, variables)
        reference.apply(grads, loss if step_control else None)
        for got, want in zip(variables, reference.weights()):
            np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
        np.testing.assert_allclose(
            float(optimizer.step_multiplier.numpy()), reference.c, rtol=1e-14
        )
    return reference


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_steps_match_the_numpy_transcription(variant):
    kwargs = VARIANTS[variant]
    reference = _run(kwargs, period=2)
    if kwargs.get("step_control", True):
        hit = {band for _, band in reference.bands}
        assert hit == set(range(len(BANDS))) | {"grow"}
    if kwargs.get("preconditioner", "diag_bfgs") == "diag_bfgs":
        assert reference.bfgs_updates > 0 and reference.bfgs_skips > 0


@pytest.mark.parametrize("reverted", ["", "a", "b", "c", "d", "e", "abcde"])
@pytest.mark.parametrize("variant", ["fr_bfgs", "pr_plain"])
def test_every_step_control_timing_matches_the_transcription(variant, reverted):
    # The private switch of `_nlcg_steps.AUTHORS_TIMING`, one part at a time.
    reference = _run(VARIANTS[variant], period=2, reverted=reverted)
    assert {band for _, band in reference.bands} == set(range(len(BANDS))) | {"grow"}


def test_step_control_period_and_threshold_match_the_transcription():
    reference = _run({}, period=3, threshold=1.5)
    assert [step for step, _ in reference.bands][:3] == [3, 6, 9]
    assert "grow" in {band for _, band in reference.bands}


def _cut_run(reverted, loss_steps):
    """Period 4: the loss average rises 20% at `loss_steps[0]` (the check at step
    4 cuts: x0.5, 90% taken back) and falls at the others (later checks grow)."""
    lr, period = 0.0625, 4
    weights, steps = _problem(seed=3, num_steps=14)
    variables = _variables(weights)
    with _nlcg_steps.timing(reverted):
        optimizer = NLCG(lr, step_control_period=period)
        optimizer.build(variables)
    reference = NumpyNLCG(weights, lr=lr, period=period, reverted=reverted)
    loss, trace = 2.0, []
    for step, grads in enumerate(steps):
        if step == loss_steps[0]:
            loss = _loss_for(reference, 1.2 * reference.ema_old)
        elif step in loss_steps[1:]:
            loss = _loss_for(reference, 0.9 * reference.ema_old)
        elif step > 0:
            loss = reference.ema
        before = [v.numpy().copy() for v in variables]
        d_prev = [v.numpy().copy() for v in optimizer._directions]
        optimizer.set_loss(loss)
        optimizer.apply(grads, variables)
        reference.apply(grads, loss)
        for got, want in zip(variables, reference.weights()):
            np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
        multiplier = float(optimizer.step_multiplier.numpy())
        np.testing.assert_allclose(multiplier, reference.c, rtol=1e-14)
        d = [v.numpy().copy() for v in optimizer._directions]
        trace.append((before, d_prev, d, [v.numpy() for v in variables]))
    return reference, trace


def test_a_cut_takes_effect_at_this_update_with_the_authors_blend():
    # Ours: the check at step 4 sees the average with step 4's loss, and the cut
    # multiplier applies to step 4 itself, which takes back 90% of the authors'
    # previous step, `lr * (0.1 * c_new * d - 0.9 * c * d_prev)`; `d` is stored.
    lr = 0.0625
    reference, trace = _cut_run(DEFAULT_REVERTED, (4, 8, 12))
    before, d_prev, d, after = trace[4]
    for w, b, di, dp in zip(after, before, d, d_prev):
        want = b + lr * (0.1 * 0.5 * di - 0.9 * 1.0 * dp)
        np.testing.assert_allclose(w, want, rtol=0, atol=1e-12)
    assert reference.bands == [(4, 0), (8, "grow"), (12, "grow")]
    assert reference.scales[3] == lr and reference.scales[4] == lr * 0.5
    assert reference.scales[7] == lr * 0.5 and reference.scales[8] == lr * 0.525


def test_the_authors_timing_cuts_at_the_next_update():
    # apple/ml-ncg's graph (`_nlcg_steps.timing("")`) reads the multiplier before
    # it assigns the cut one: the check's own update runs at the old rate, with
    # the take-back blended at the new rate (`lr * ((1 - p) * d - p * (c / c_new)
    # * d_prev)`), and the next update at the new rate; the check at step 4
    # compares the average before step 4's loss. Measured by running their TF1
    # graph (see `_numpy_nlcg.py`).
    lr = 0.0625
    reference, trace = _cut_run("", (3, 7, 11))
    before, d_prev, d, after = trace[4]
    for w, b, di, dp in zip(after, before, d, d_prev):
        want = b + lr * (0.1 * di - 0.9 * (1.0 / 0.5) * dp)
        np.testing.assert_allclose(w, want, rtol=0, atol=1e-12)
    assert reference.bands == [(4, 0), (8, "grow"), (12, "grow")]
    assert reference.scales[4] == lr and reference.scales[5] == lr * 0.5
    assert reference.scales[8] == lr * 0.5 and reference.scales[9] == lr * 0.525


def test_the_transcription_defaults_to_the_library_timing():
    assert NumpyNLCG([np.ones(2)], lr=0.1).timing == _nlcg_steps.AUTHORS_TIMING


def test_gradient_accumulation_averages_gradients_and_losses():
    weights, steps = _problem(num_steps=12)
    variables = _variables(weights)
    optimizer = NLCG(0.0625, step_control_period=2, gradient_accumulation_steps=2)
    reference = NumpyNLCG(weights, lr=0.0625, period=2)
    losses = [2.0, 2.2, 2.5, 2.1, 1.5, 1.9, 2.4, 2.6, 2.0, 1.0, 1.2, 1.1]
    for i in range(0, 12, 2):
        for j in (i, i + 1):
            observe_loss(optimizer, losses[j])
            optimizer.apply(steps[j], variables)
        mean = [(a + b) / 2 for a, b in zip(steps[i], steps[i + 1])]
        reference.apply(mean, (losses[i] + losses[i + 1]) / 2)
    for got, want in zip(variables, reference.weights()):
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


def test_missing_loss_is_a_clear_error_and_observe_loss_is_a_no_op_elsewhere():
    variable = keras.Variable(np.ones(3))
    with pytest.raises(ValueError, match=r"observe_loss\(optimizer, loss\)"):
        NLCG(0.1).apply([tf.ones(3, "float64")], [variable])
    NLCG(0.1, step_control=False).apply([tf.ones(3, "float64")], [variable])
    sgd = keras.optimizers.SGD(0.1)
    observe_loss(sgd, 1.0)  # no variables, no error
    assert not _loss_aware.uses_loss(sgd)
    assert _loss_aware.uses_loss(keras.optimizers.LossScaleOptimizer(NLCG(0.1)))
    with pytest.raises(ValueError, match="`loss` must be a scalar"):
        NLCG(0.1).set_loss(tf.ones(3))


def test_config_round_trip():
    optimizer = NLCG(
        keras.optimizers.schedules.CosineDecay(0.5, decay_steps=100),
        beta_rule="PR",
        preconditioner=None,
        step_control=True,
        lars_eta=0.001,
        step_control_period=3,
        step_control_threshold=0.5,
        loss_smoothing=0.8,
        epsilon=1e-6,
        global_clipnorm=1.0,
    )
    config = optimizer.get_config()
    assert config["beta_rule"] == "pr"
    restored = NLCG.from_config(copy.deepcopy(config))
    assert restored.get_config() == config
    revived = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(revived, NLCG) and revived.get_config() == config


@keras.saving.register_keras_serializable(package="kr_tests")
class LossObservingModel(_fit_helpers.LossObservingModel):
    pass


def _nlcg():
    return NLCG(0.5, step_control_period=2)


def test_save_load_continue_matches_an_uninterrupted_run(tmp_path):
    x, y = _fit_helpers.data(80)
    fit = {"batch_size": 16, "shuffle": False, "verbose": 0}
    whole = _fit_helpers.model(_nlcg, model_class=LossObservingModel)
    whole.fit(x, y, epochs=4, **fit)
    first = _fit_helpers.model(_nlcg, model_class=LossObservingModel)
    first.fit(x, y, epochs=2, **fit)
    first.save(tmp_path / "nlcg.keras")
    loaded = keras.models.load_model(tmp_path / "nlcg.keras")
    assert isinstance(loaded, LossObservingModel)
    assert isinstance(loaded.optimizer, NLCG)
    loaded.fit(x, y, epochs=2, **fit)
    for a, b in zip(whole.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert float(whole.optimizer.step_multiplier.numpy()) == float(
        loaded.optimizer.step_multiplier.numpy()
    )


def _replica_run(strategy, lars_eta=None, lr=2.0):
    x, y = _fit_helpers.data(100)  # batches of 32, 32, 32, 4: replicas' losses differ
    net = _fit_helpers.model(
        lambda: NLCG(lr, step_control_period=2, loss_smoothing=0.0, lars_eta=lars_eta),
        strategy,
        model_class=_fit_helpers.LossObservingModel,
    )
    multipliers = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: multipliers.append(
            float(net.optimizer.step_multiplier.numpy())
        )
    )
    net.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0, callbacks=[record])
    optimizer = net.optimizer
    state = [optimizer.step_multiplier, optimizer._loss_ema, optimizer._rz]
    return net.get_weights(), [float(v.numpy()) for v in state], multipliers


@pytest.mark.parametrize(
    "num_replicas",
    [
        pytest.param(
            2,
            marks=pytest.mark.slow(
                reason="covered in the default run by: tests/optimizers/"
                "test_loss_aware.py::test_fit_under_a_strategy_hands_the_one_device_"
                "loss[multi_device_replicator] (NLCG on 2 replicas, 100 samples: "
                "the weights, the losses it sees and its step multipliers equal "
                "one device's, and the step control cuts)"
            ),
        ),
        pytest.param(4, marks=pytest.mark.slow),
    ],
)
def test_replicas_train_as_one_device(num_replicas):
    one, one_state, one_multipliers = _replica_run(tf.distribute.get_strategy())
    many, many_state, many_multipliers = _replica_run(
        kr.MultiDeviceReplicator(num_replicas=num_replicas)
    )
    # At rate 2 the checks at steps 4 and 8 cut and take back 70% of the previous
    # step: last-bit differences of the reduced gradients grow (to 1.2e-9 after
    # 12 steps with the authors' timing; 3e-16 with step_control=False).
    _fit_helpers.assert_weights_close(one, many, atol=1e-8)
    _assert_state_close(one_state, many_state, rtol=1e-8)
    # The same branches at every step, and the step control did cut the step.
    assert one_multipliers == many_multipliers
    assert min(one_multipliers) < 1.0


def _assert_state_close(one, many, rtol):
    multiplier, ema, rz = range(3)
    np.testing.assert_allclose(
        [one[multiplier], one[rz]], [many[multiplier], many[rz]], rtol=rtol
    )
    # Keras computes losses in floatx (float32) even for a float64 model, and the
    # global mean of 2 replica means rounds differently from one 32-sample mean.
    np.testing.assert_allclose(one[ema], many[ema], rtol=1e-6)


@pytest.mark.slow
def test_replicas_with_lars_scaling_train_as_one_device():
    one, one_state, _ = _replica_run(tf.distribute.get_strategy(), 0.02, lr=0.5)
    two = kr.MultiDeviceReplicator(num_replicas=2)
    many, many_state, _ = _replica_run(two, 0.02, lr=0.5)
    # LARS gives every layer a step of fixed relative size however small its
    # gradient, so last-bit differences of the reduced gradients are not damped:
    # measured 1e-9 after 12 steps (2e-16 without LARS).
    _fit_helpers.assert_weights_close(one, many, atol=1e-8)
    _assert_state_close(one_state, many_state, rtol=1e-8)


def test_mixed_precision_with_loss_scale_optimizer():
    x, y = _fit_helpers.data(64)
    x = x.astype("float32")
    keras.utils.set_random_seed(3)
    inputs = keras.Input((x.shape[1],))
    hidden = keras.layers.Dense(8, "tanh", dtype="mixed_float16")(inputs)
    outputs = keras.layers.Dense(3, dtype="float32")(hidden)
    net = _fit_helpers.LossObservingModel(inputs, outputs)
    net.compile(
        keras.optimizers.LossScaleOptimizer(NLCG(0.5)),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    before = net.evaluate(x, y, verbose=0)
    net.fit(x, y, batch_size=16, epochs=4, verbose=0)
    after = net.evaluate(x, y, verbose=0)
    assert np.isfinite(after) and after < before
    assert net.optimizer.inner_optimizer.iterations.numpy() == 16


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"learning_rate": -1.0}, ValueError, "Received: learning_rate=-1.0"),
        ({"beta_rule": "hs"}, ValueError, "Received: beta_rule='hs'"),
        ({"preconditioner": "bfgs"}, ValueError, "Received: preconditioner='bfgs'"),
        ({"step_control": "yes"}, TypeError, "Received: step_control='yes'"),
        ({"lars_eta": 0.0}, ValueError, r"`lars_eta` must be > 0.0"),
        ({"step_control_period": 0}, ValueError, "step_control_period=0"),
        ({"step_control_threshold": -1.0}, ValueError, "threshold=-1.0"),
        ({"loss_smoothing": 1.0}, ValueError, "loss_smoothing=1.0"),
        ({"epsilon": 0.0}, ValueError, "Received: epsilon=0.0"),
    ],
)
def test_bad_arguments_fail_in_the_constructor(kwargs, error, message):
    kwargs = {"learning_rate": 0.1, **kwargs}
    with pytest.raises(error, match=message):
        NLCG(**kwargs)


def test_whole_list_update_overrides_the_hook_compat_checks():
    # The override is the one private Keras name outside `_compat`: it must be the
    # hook `_compat.optimizer.check_upstream()` verifies Keras still calls.
    from keras_replicator._compat import optimizer as compat_optimizer
    from keras_replicator.optimizers._whole_list import WholeListOptimizer

    assert compat_optimizer.UPDATE_STEP_HOOK in vars(WholeListOptimizer)
    assert not compat_optimizer.check_upstream()


def test_parameter_server_training_is_refused():
    # A real cluster is not needed to check the type test: an unstarted instance.
    strategy = object.__new__(tf.distribute.experimental.ParameterServerStrategy)
    with pytest.raises(ValueError, match="cannot train under parameter-server"):
        _nlcg_steps.refuse_parameter_servers(strategy)
    _nlcg_steps.refuse_parameter_servers(tf.distribute.get_strategy())
