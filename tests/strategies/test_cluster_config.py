import json

import pytest

from keras_replicator._tf_config import read_tf_config
from keras_replicator.strategies._cluster_config import describes_cluster

GOOD = {
    "cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},
    "task": {"type": "worker", "index": 1},
}


def _env(config):
    return {"TF_CONFIG": config if isinstance(config, str) else json.dumps(config)}


def test_good_config_describes_a_cluster():
    assert not describes_cluster(None)
    config = read_tf_config(_env(GOOD))
    assert describes_cluster(config)
    single = {
        "cluster": {"worker": ["127.0.0.1:1"]},
        "task": GOOD["task"] | {"index": 0},
    }
    assert not describes_cluster(read_tf_config(_env(single)))


def test_parameter_server_cluster_needs_chief_worker_and_ps():
    from keras_replicator.strategies import _cluster_config

    config = {
        "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
        "task": {"type": "chief", "index": 0},
    }
    assert not _cluster_config.has_parameter_servers(config)
    with pytest.raises(ValueError, match=r"\['ps'\] missing"):
        _cluster_config.check_parameter_server_cluster(config)
    config["cluster"]["ps"] = ["127.0.0.1:3"]
    assert _cluster_config.has_parameter_servers(config)
    _cluster_config.check_parameter_server_cluster(config)
