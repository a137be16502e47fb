import json

import pytest

from keras_replicator.strategies._cluster_config import (
    describes_cluster,
    read_tf_config,
)

GOOD = {
    "cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},
    "task": {"type": "worker", "index": 1},
}


def _env(config):
    return {"TF_CONFIG": config if isinstance(config, str) else json.dumps(config)}


def test_unset_or_empty_is_none():
    assert read_tf_config({}) is None
    assert read_tf_config({"TF_CONFIG": "  "}) is None


def test_good_config_describes_a_cluster():
    config = read_tf_config(_env(GOOD))
    assert describes_cluster(config)
    single = {
        "cluster": {"worker": ["127.0.0.1:1"]},
        "task": GOOD["task"] | {"index": 0},
    }
    assert not describes_cluster(read_tf_config(_env(single)))


@pytest.mark.parametrize(
    "config, field",
    [
        ("{not json", "`TF_CONFIG` must be JSON"),
        ([], "`TF_CONFIG` must be a JSON object"),
        ({"task": GOOD["task"]}, "`TF_CONFIG['cluster']`"),
        ({"cluster": {"boss": ["a:1"]}, "task": {}}, "unknown task type 'boss'"),
        ({"cluster": {"worker": []}, "task": {}}, "`TF_CONFIG['cluster']['worker']`"),
        (
            {"cluster": {"worker": ["127.0.0.1"]}, "task": GOOD["task"]},
            "`TF_CONFIG['cluster']['worker'][0]`",
        ),
        ({"cluster": GOOD["cluster"]}, "`TF_CONFIG['task']` is missing"),
        (
            {"cluster": GOOD["cluster"], "task": {"type": "chief", "index": 0}},
            "`TF_CONFIG['task']['type']`",
        ),
        (
            {"cluster": GOOD["cluster"], "task": {"type": "worker", "index": "0"}},
            "`TF_CONFIG['task']['index']` must be an integer",
        ),
        (
            {"cluster": GOOD["cluster"], "task": {"type": "worker", "index": 2}},
            "must be in [0, 2)",
        ),
    ],
)
def test_malformed_config_names_the_field(config, field):
    with pytest.raises(ValueError) as error:
        read_tf_config(_env(config))
    assert field in str(error.value)
    assert "Received" in str(error.value)
