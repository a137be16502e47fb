"""The conformance suite on our strategies: every check must pass.

Local strategies run in this process (on the session's 4 logical CPUs); the
multi-worker strategy runs once in 2 real worker processes on 127.0.0.1 (on its
default transport, the socket ring; on TensorFlow's collectives in the slow run) and
each check's row is asserted separately.
"""

import functools

import pytest

from keras_replicator.testing import CHECK_NAMES, LAYOUT_CHECK_NAMES, run_conformance
from keras_replicator.testing._factories import get_factory
from keras_replicator.testing._worker import run_checks_here


@functools.cache
def _strategy(name):
    return get_factory(name).build()


class _Built:
    def __init__(self, strategy):
        self.build = lambda: strategy


# Checks on multi-device-2 left to `make test-slow`: the same check runs in the
# default run on multi-worker-2 (test_multi_worker_strategy_passes[check]), and
# the named test checks the same behaviour on local replicas.
_COVERED_LOCALLY = {
    "gradient_clipping": "tests/keras_integration/test_clipping.py",
    "transformer_embeddings": "tests/keras_integration/test_embedding_gradients.py"
    "::test_transformer_with_an_uneven_batch_trains_like_one_device",
    "adam_on_embeddings": "tests/keras_integration/test_embedding_gradients.py"
    "::test_adam_on_a_repeating_embedding_is_dense_adam",
    "gradient_accumulation": "tests/keras_integration/test_gradient_accumulation.py"
    "::test_fit_with_accumulation_equals_one_device_at_the_effective_batch",
    "synchronized_batch_norm": "tests/layers/test_sync_batch_normalization.py"
    "::test_all_replicas_group_trains_like_one_device",
    "mixed_float16_overflow": "tests/keras_integration/test_mixed_precision.py"
    "::test_an_overflow_in_one_replica_skips_the_step_on_both",
    "custom_train_step_loss": "tests/keras_integration/test_loss_contracts.py"
    "::test_every_loss_form_trains_like_one_device",
    "custom_train_step_mean_loss": "tests/keras_integration/test_loss_contracts.py"
    "::test_every_loss_form_trains_like_one_device",
    "custom_train_step_average_loss": "tests/keras_integration/"
    "test_loss_contracts.py::test_every_loss_form_trains_like_one_device",
}
_UNKNOWN = set(_COVERED_LOCALLY) - set(CHECK_NAMES)
if _UNKNOWN:
    raise ValueError(f"_COVERED_LOCALLY names no check: {sorted(_UNKNOWN)}")


def _local_case(factory, check):
    marks = []
    if factory == "multi-device-4":
        marks.append(
            pytest.mark.slow(
                reason="covered in the default run by: the same checks on "
                "multi-device-2 and multi-worker-2"
            )
        )
    elif check in _COVERED_LOCALLY:
        marks.append(
            pytest.mark.slow(
                reason="covered in the default run by: "
                f"test_multi_worker_strategy_passes[{check}] and "
                f"{_COVERED_LOCALLY[check]}"
            )
        )
    return pytest.param(factory, check, id=f"{factory}-{check}", marks=marks)


@pytest.mark.parametrize(
    "factory, check",
    [
        _local_case(factory, check)
        for factory in ("multi-device-2", "multi-device-4")
        for check in CHECK_NAMES
    ],
)
def test_local_strategy_passes(factory, check):
    [result] = run_checks_here(_Built(_strategy(factory)), [check])
    assert result.passed, result.detail


@functools.cache
def _multi_worker_rows(factory):
    rows = run_conformance([factory], timeout=900)
    return {row.check: row for row in rows}


@pytest.mark.multi_worker
@pytest.mark.timeout(960)
@pytest.mark.parametrize("check", CHECK_NAMES)
def test_multi_worker_strategy_passes(check):
    row = _multi_worker_rows("multi-worker-2")[check]
    assert row.passed, row.detail


@pytest.mark.slow
@pytest.mark.multi_worker
@pytest.mark.timeout(960)
@pytest.mark.parametrize("check", CHECK_NAMES)
def test_multi_worker_on_the_collectives_passes(check):
    """The default is the socket ring; TensorFlow's collectives must pass too."""
    row = _multi_worker_rows("multi-worker-2-collective")[check]
    assert row.passed, row.detail


# The layout factories (issue 52): checks known to fail on DTensor's expansion,
# with the symptom measured, stay visible as strict xfails (they fail the run
# once they pass, so the list cannot go stale); docs/layouts.md lists them.
_LAYOUT_GAPS = {
    "string_dict_inputs": "a Dense split by rows right after a Concatenate "
    "(layouts/_known_errors.py): predictions 1.2 off",
}
_LAYOUT_GAPS_BY_FACTORY = {
    "model-parallel-2x2": {
        **_LAYOUT_GAPS,
        "adam_on_embeddings": "DTensor refuses the step: 'input and output "
        "layout do not agree on non-axis dim 1'",
    },
    "model-parallel-2x2-2-workers": {
        **_LAYOUT_GAPS,
        "adam_on_embeddings": "DTensor refuses the step: 'input and output "
        "layout do not agree on non-axis dim 1'",
    },
    "fully-sharded-2": {
        "synchronized_batch_norm": "DTensor refuses the step: 'EmitAllScatter "
        "was passed a desired_layout'",
    },
}
# In the default run: the core fit / evaluate / predict / save path and the
# layout check; the rest of the passing checks run in `make test-slow`.
_LAYOUT_DEFAULT_RUN = ("fit_numpy", "evaluate", "predict", "save_load")
# Whole factories left to `make test-slow`, with what covers them by default.
_LAYOUT_SLOW_FACTORIES = {
    "model-parallel-2x2-2-workers": "the 2-worker mesh is in the default run in "
    "tests/layouts/test_multi_worker.py (GPT-2 fit + LoRA)",
}


def _layout_case(factory, check):
    gaps = _LAYOUT_GAPS_BY_FACTORY[factory]
    marks = []
    if check in gaps:
        marks.append(pytest.mark.xfail(reason=gaps[check], strict=True))
    if factory in _LAYOUT_SLOW_FACTORIES:
        marks.append(pytest.mark.slow(reason=_LAYOUT_SLOW_FACTORIES[factory]))
    elif check in gaps or check not in _LAYOUT_DEFAULT_RUN + LAYOUT_CHECK_NAMES:
        marks.append(
            pytest.mark.slow(
                reason="covered in the default run by: the same factory's "
                f"{', '.join(_LAYOUT_DEFAULT_RUN + LAYOUT_CHECK_NAMES)} and "
                "tests/strategies/test_model_parallel.py"
            )
        )
    return pytest.param(factory, check, id=f"{factory}-{check}", marks=marks)


@functools.cache
def _layout_rows(factory, everything):
    # In a process of their own: DTensor and tf.distribute's collectives share
    # group keys in one process (tests/conftest.py).
    checks = CHECK_NAMES + LAYOUT_CHECK_NAMES
    if not everything:
        checks = _LAYOUT_DEFAULT_RUN + LAYOUT_CHECK_NAMES
    rows = run_conformance([factory], list(checks), timeout=900)
    return {row.check: row for row in rows}


@pytest.mark.timeout(960)
@pytest.mark.parametrize(
    "factory, check",
    [
        _layout_case(factory, check)
        for factory in _LAYOUT_GAPS_BY_FACTORY
        for check in CHECK_NAMES + LAYOUT_CHECK_NAMES
    ],
)
def test_layout_strategy_passes(factory, check):
    everything = check not in _LAYOUT_DEFAULT_RUN + LAYOUT_CHECK_NAMES
    row = _layout_rows(factory, everything)[check]
    assert row.passed, row.detail
