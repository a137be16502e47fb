"""TF_CONFIG is validated once, without TensorFlow, for the launcher and strategies."""

import doctest
import json
import subprocess
import sys

import pytest

from keras_replicator import _tf_config
from keras_replicator._tf_config import num_tasks, parse_tf_config, read_tf_config

WORKERS = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}
GOOD = {"cluster": WORKERS, "task": {"type": "worker", "index": 1}}

# (TF_CONFIG, what the error must say): each field that can be wrong, once.
MALFORMED = [
    ("{not json", "`TF_CONFIG` must be JSON"),
    ([], "`TF_CONFIG` must be a JSON object"),
    ({"task": GOOD["task"]}, "`TF_CONFIG['cluster']` must map task types"),
    ({"cluster": {"boss": ["a:1"]}, "task": {}}, "unknown task type 'boss'"),
    (
        {"cluster": {"worker": []}, "task": {}},
        "`TF_CONFIG['cluster']['worker']` must be a non-empty list",
    ),
    (
        {"cluster": {"worker": ["127.0.0.1"]}, "task": GOOD["task"]},
        "`TF_CONFIG['cluster']['worker'][0]` must be a \"host:port\" string. "
        "Received: address='127.0.0.1'",
    ),
    (
        {"cluster": {"worker": ["a:1", "b:99999"]}, "task": GOOD["task"]},
        "`TF_CONFIG['cluster']['worker'][1]`",
    ),
    ({"cluster": WORKERS}, "`TF_CONFIG['task']` is missing"),
    (
        {"cluster": WORKERS, "task": {"type": "chief", "index": 0}},
        "`TF_CONFIG['task']['type']` must be one of the cluster's task types "
        "['worker']. Received: type='chief'",
    ),
    (
        {"cluster": WORKERS, "task": {"type": "worker", "index": "0"}},
        "`TF_CONFIG['task']['index']` must be an integer in [0, 2) because "
        "`TF_CONFIG['cluster']['worker']` lists 2 address(es). Received: index='0'",
    ),
    ({"cluster": WORKERS, "task": {"type": "worker", "index": 2}}, "index=2 in"),
    ({"cluster": WORKERS, "task": {"type": "worker", "index": True}}, "index=True"),
]


def _raw(config):
    return config if isinstance(config, str) else json.dumps(config)


def test_unset_or_blank_is_none():
    assert read_tf_config({}) is None
    assert read_tf_config({"TF_CONFIG": "  "}) is None


def test_a_good_config_is_returned_whole_with_its_counts():
    config = {**GOOD, "rpc_layer": "grpc"}
    assert read_tf_config({"TF_CONFIG": json.dumps(config)}) == config
    assert num_tasks(config) == 2 and num_tasks(config, "worker") == 2
    assert num_tasks(config, "ps") == 0 and num_tasks(None) == 0


@pytest.mark.parametrize("config, message", MALFORMED)
def test_malformed_config_names_the_field(config, message):
    with pytest.raises(ValueError) as error:
        parse_tf_config(_raw(config))
    assert message in str(error.value)
    assert "Received: " in str(error.value)


def test_docstring_examples():
    assert doctest.testmod(_tf_config, raise_on_error=False).failed == 0


def test_importing_it_or_the_launcher_imports_no_tensorflow():
    code = (
        "import sys, keras_replicator._tf_config, keras_replicator.launch._cluster, "
        "keras_replicator.cli; print('tensorflow' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == "False"


def _launcher_error(raw, monkeypatch):
    from keras_replicator.launch import LaunchOptions
    from keras_replicator.launch._cluster import plan_cluster

    plan_cluster(LaunchOptions(), {"TF_CONFIG": raw})


def _strategy_error(name):
    def make(raw, monkeypatch):
        import keras_replicator as kr

        monkeypatch.setenv("TF_CONFIG", raw)
        getattr(kr, name)()

    return make


@pytest.mark.parametrize("config, message", MALFORMED)
def test_launcher_and_strategies_report_the_same_error(
    config, message, monkeypatch, clean_tf_config
):
    """Before the launcher and the strategies shared one validator, they disagreed
    (an unknown task type passed the launcher and failed in the worker)."""
    callers = {
        "launch": _launcher_error,
        "MultiWorkerReplicator": _strategy_error("MultiWorkerReplicator"),
        "ParameterServerReplicator": _strategy_error("ParameterServerReplicator"),
        "auto": _strategy_error("auto"),
    }
    errors = {}
    for name, caller in callers.items():
        with pytest.raises(ValueError) as error:
            caller(_raw(config), monkeypatch)
        errors[name] = str(error.value)
    assert message in errors["launch"]
    assert set(errors.values()) == {errors["launch"]}, errors
