"""TF_CONFIG is validated once, without TensorFlow, for the launcher and strategies."""

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
        "`TF_CONFIG['cluster']['worker'][0]` must be a \"host:port\" string: "
        "expected e.g. \"127.0.0.1:2222\". Received: address='127.0.0.1'",
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


def _workers(*addresses):
    worker = {"type": "worker", "index": 0}
    return {"cluster": {"worker": list(addresses)}, "task": worker}


# Each was accepted (or crashed with a bare Python error) before: a hostile or
# mistaken TF_CONFIG must fail with a ValueError naming the field.
HOSTILE = [
    (
        _workers("127.0.0.1:2222", "127.0.0.1:2222"),
        "`TF_CONFIG['cluster']['worker'][1]` repeats the address of "
        "`TF_CONFIG['cluster']['worker'][0]`",
    ),
    (
        {
            "cluster": {"chief": ["localhost:2222"], "ps": ["[::1]:2222"]},
            "task": {"type": "chief", "index": 0},
        },
        "`TF_CONFIG['cluster']['ps'][0]` repeats the address of "
        "`TF_CONFIG['cluster']['chief'][0]`",
    ),
    (_workers("127.0.0.1:١٢٣٤"), "the port '١٢٣٤' must be ASCII decimal digits"),
    (_workers("127.0.0.1:²"), "the port '²' must be ASCII decimal digits"),
    (_workers("127.0.0.1:0"), "in [1, 65535]"),
    (_workers("127.0.0.1:65536"), "in [1, 65535]"),
    (_workers("127.0.0.1:+80"), "must be ASCII decimal digits"),
    (_workers("my host:2222"), "the host 'my host' may only hold"),
    (_workers("host\n:2222"), "the host 'host\\n' may only hold"),
    (_workers(" 127.0.0.1:2222"), "may only hold"),
    (_workers("::1:2222"), 'an IPv6 host must be in brackets, e.g. "[::1]:2222"'),
    (_workers("a:b:2222"), "an IPv6 host must be in brackets"),
    (_workers("[::g]:2222"), "is not an IPv6 address in brackets"),
    (_workers(["127.0.0.1:2222"]), "got a list"),
    (
        {"cluster": WORKERS, "task": {"type": ["worker"], "index": 0}},
        "`TF_CONFIG['task']['type']` must be one of",
    ),
    ("[" * 100_000, "`TF_CONFIG` is nested too deeply"),
    ('{"a":' * 100_000, "`TF_CONFIG` is nested too deeply"),
    ('{"task": ' + "9" * 5000 + "}", "`TF_CONFIG` must be JSON"),
]


@pytest.mark.parametrize(
    "config, message",
    HOSTILE,
    ids=[
        "duplicate-address",
        "duplicate-loopback-port",
        "arabic-indic-port",
        "superscript-port",
        "port-0",
        "port-65536",
        "signed-port",
        "host-with-space",
        "host-with-newline",
        "leading-space",
        "unbracketed-ipv6",
        "extra-colon",
        "bad-ipv6",
        "address-not-a-string",
        "task-type-a-list",
        "deep-list",
        "deep-object",
        "huge-integer",
    ],
)
def test_hostile_or_mistaken_config_names_the_field(config, message):
    with pytest.raises(ValueError) as error:
        parse_tf_config(_raw(config))
    assert message in str(error.value)
    assert "Received: " in str(error.value)
    assert len(str(error.value)) < 3000  # a megabyte of input is not echoed whole


def test_a_validated_dict_that_cannot_be_shown_is_still_a_value_error():
    deep = node = {}
    for _ in range(100_000):
        node["a"] = node = {}
    cyclic = {}
    cyclic["cluster"] = cyclic
    for config in (deep, cyclic):
        with pytest.raises(ValueError, match="TF_CONFIG"):
            _tf_config.validate_tf_config(config)


def test_ipv6_in_brackets_and_distinct_loopback_ports_are_fine():
    config = _workers("[::1]:2222", "localhost:2223", "127.0.0.1:2224")
    assert parse_tf_config(json.dumps(config)) == config


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
