"""Every `>>>` example in keras_replicator runs, and every module's examples ran.

One test per module whose source holds `>>>`: its examples are collected with
`doctest.DocTestFinder` and run, and the test fails if one fails, if none ran, or
if the source holds more `>>>` lines than the finder collected (an example in a
place doctest does not look, such as a nested function, would never run).

They run in this pytest process, on the 4 logical CPU devices tests/conftest.py
makes, so examples that build a `MultiDeviceReplicator` share that configuration.
`os.environ`, Keras' float type and dtype policy and the working directory are
restored after each module.

An example may carry `# doctest: +SKIP` only when running it in a test is
impossible; each such module is listed in `SKIPPED` with the reason, and a test
checks that the list and the sources agree. Modules in `SLOW` run in
`make test-slow` only, with the reason.
"""

import doctest
import importlib
import io
import os
import pathlib
import re

import pytest

import keras_replicator

_PACKAGE = pathlib.Path(keras_replicator.__file__).parent
_EXAMPLE_LINE = re.compile(r"^\s*>>>", re.MULTILINE)
_SKIP = "doctest: +SKIP"

# Module -> why its skipped examples cannot run in a test.
SKIPPED = {
    "keras_replicator.strategies.parameter_server": (
        "builds a ParameterServerReplicator: needs a TF_CONFIG cluster with chief, "
        "worker and parameter-server processes (tests/strategies run one)"
    ),
    "keras_replicator.parameter_server._faults": (
        "`wait` needs a ParameterServerReplicator's coordinator (a cluster of "
        "processes)"
    ),
    "keras_replicator.parameter_server._retry": (
        "`run_all` needs a ParameterServerReplicator's coordinator (a cluster of "
        "processes)"
    ),
    "keras_replicator.strategies.tpu": "builds a TPUReplicator: needs a TPU",
}

# Module -> why its examples run in `make test-slow` only.
SLOW = {
    "keras_replicator.testing._suite": (
        "`run_conformance` starts a fresh Python process that imports TensorFlow "
        "(10-30 s); tests/testing/test_conformance.py runs it in the default run"
    ),
}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(_PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, str]:
    return {
        _module_name(path): path.read_text(encoding="utf-8")
        for path in sorted(_PACKAGE.rglob("*.py"))
    }


# Examples that run DTensor run in the DTensor test process only (tests/conftest.py
# says why), and only they run there.
DTENSOR_MODULES = {
    "keras_replicator.layouts._batches",
    "keras_replicator.layouts._known_errors",
    "keras_replicator.layouts._mesh",
    "keras_replicator.layouts._plan",
    "keras_replicator.layouts._variables",
    "keras_replicator.strategies.model_parallel",
}
_IN_DTENSOR_PROCESS = os.environ.get("KR_DTENSOR_TEST_PROCESS") == "1"
_ALL_WITH_EXAMPLES = sorted(name for name, text in _sources().items() if ">>>" in text)
_WITH_EXAMPLES = [
    name
    for name in _ALL_WITH_EXAMPLES
    if (name in DTENSOR_MODULES) == _IN_DTENSOR_PROCESS
]
_CASES = [
    pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name
    for name in _WITH_EXAMPLES
]


def test_modules_with_examples_are_found():
    # Guards the discovery itself: an empty parametrization would pass silently.
    assert len(_ALL_WITH_EXAMPLES) >= 75, _ALL_WITH_EXAMPLES
    assert DTENSOR_MODULES <= set(_ALL_WITH_EXAMPLES), DTENSOR_MODULES


def test_listed_modules_exist():
    assert set(SLOW) <= set(_ALL_WITH_EXAMPLES), SLOW


def test_every_skip_is_listed_with_a_reason():
    skipping = sorted(name for name, text in _sources().items() if _SKIP in text)
    assert skipping == sorted(SKIPPED), (
        "An example skipped with `# doctest: +SKIP` must be listed in SKIPPED with "
        "the reason it cannot run in a test; a listed module must still skip one."
    )


@pytest.fixture
def restored_state(tmp_path, monkeypatch):
    import keras

    monkeypatch.chdir(tmp_path)
    environ = dict(os.environ)
    floatx, policy = keras.backend.floatx(), keras.config.dtype_policy()
    yield
    os.environ.clear()
    os.environ.update(environ)
    keras.backend.set_floatx(floatx)
    keras.config.set_dtype_policy(policy)


@pytest.mark.parametrize(
    "name", _CASES, ids=lambda n: n.removeprefix("keras_replicator.")
)
def test_examples_run(name, restored_state):
    module = importlib.import_module(name)
    tests = [test for test in doctest.DocTestFinder().find(module) if test.examples]
    collected = sum(len(test.examples) for test in tests)
    written = len(_EXAMPLE_LINE.findall(pathlib.Path(module.__file__).read_text()))
    assert collected == written, (
        f"{name} has {written} `>>>` lines but doctest collects {collected}: move "
        "the example into a docstring doctest reads (module, class, function, "
        "method)."
    )
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    for test in tests:
        runner.run(test, out=report.write)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, report.getvalue()
    assert result.attempted > 0, f"no example of {name} ran (all skipped?)"
