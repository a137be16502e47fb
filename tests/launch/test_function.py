"""launch_function(): a Python function as N workers, the notebook way."""

import textwrap
import types

import pytest

from keras_replicator.launch import LaunchError, launch_function
from keras_replicator.launch._function import function_payload


def worker_info(offset, scale=1):
    import os

    index = int(os.environ["KERAS_REPLICATOR_WORKER_INDEX"])
    return {
        "value": (index + offset) * scale,
        "run": os.environ["KERAS_REPLICATOR_RESTART_COUNT"],
    }


def broken():
    raise ArithmeticError("the function broke")


def flaky():
    import os

    if os.environ["KERAS_REPLICATOR_RESTART_COUNT"] == "0":
        raise SystemExit(3)
    return "second run"


def returns_a_lock():
    import threading

    return threading.Lock()


def _as_if_defined_in_a_notebook(function):
    """The same code with `__module__ == "__main__"`, which workers cannot import."""
    copy = types.FunctionType(function.__code__, {}, function.__name__)
    copy.__module__ = "__main__"
    return copy


def test_a_module_function_runs_on_every_worker_with_its_arguments():
    results = launch_function(
        worker_info, 2, args=(10,), kwargs={"scale": 2}, echo=False, timeout=60
    )
    assert results == [{"value": 20, "run": "0"}, {"value": 22, "run": "0"}]


def test_a_notebook_function_travels_as_source():
    notebook_function = _as_if_defined_in_a_notebook(worker_info)
    payload = function_payload(notebook_function)
    assert payload["kind"] == "source"
    assert payload["source"].startswith("def worker_info(offset, scale=1):")
    results = launch_function(notebook_function, 2, args=(1,), echo=False, timeout=60)
    assert [r["value"] for r in results] == [1, 2]


def test_a_failure_raises_with_the_workers_traceback():
    with pytest.raises(LaunchError) as caught:
        launch_function(broken, 2, echo=False, timeout=60)
    message = str(caught.value)
    assert "exited with code 1" in message
    assert "ArithmeticError: the function broke" in message
    assert caught.value.result.first_failure is not None


def test_restarts_apply_to_functions():
    assert launch_function(flaky, 2, max_restarts=1, echo=False, timeout=60) == [
        "second run",
        "second run",
    ]


def test_an_unpicklable_return_value_is_explained():
    with pytest.raises(LaunchError, match="must be picklable"):
        launch_function(returns_a_lock, 1, echo=False, timeout=60)


def test_bad_functions_are_refused_before_starting():
    with pytest.raises(TypeError, match="not a lambda"):
        launch_function(lambda: 1, 2)
    with pytest.raises(TypeError, match="defined with `def`"):
        launch_function(print, 2)
    factor = 3

    def closure():
        return factor

    with pytest.raises(TypeError, match=r"uses \['factor'\]"):
        launch_function(closure, 2)


def test_unpicklable_arguments_are_refused():
    import threading

    with pytest.raises(TypeError, match="`args` and `kwargs` must be picklable"):
        launch_function(worker_info, 2, args=(threading.Lock(),))


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="Received: num_workers=0"):
        launch_function(worker_info, 0)


NOTEBOOK_TRAINING = textwrap.dedent(
    """
    def train(epochs):
        import os
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import keras_replicator as kr
        from keras_replicator.testing import _workloads

        strategy = kr.MultiWorkerReplicator()
        with strategy.scope():
            model = _workloads.mlp()
        x, y = _workloads.classification_data(256)
        history = model.fit(x, y, batch_size=64, epochs=epochs, verbose=0)
        return history.history["loss"]
    """
)


@pytest.mark.slow(
    reason="covered in the default run by: test_a_notebook_function_travels_as_source "
    "(a notebook's function run on two workers) and tests/keras_integration/"
    "test_fit_input.py::test_two_workers_fed_plainly_match_one_device (a fit "
    "through launch_function on two workers)"
)
@pytest.mark.multi_worker
@pytest.mark.timeout(400)
def test_a_notebook_cell_trains_on_two_workers(tmp_path):
    cell = tmp_path / "cell.py"  # IPython keeps each cell's source like a file
    cell.write_text(NOTEBOOK_TRAINING)
    namespace = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_TRAINING, str(cell), "exec"), namespace)
    losses = launch_function(namespace["train"], 2, args=(2,), echo=False, timeout=300)
    assert len(losses) == 2 and len(losses[0]) == 2
    assert losses[0] == losses[1]  # every worker logs the global numbers
