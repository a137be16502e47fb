import importlib
import json

import pytest

import keras_replicator as kr

auto_module = importlib.import_module("keras_replicator.strategies._auto")


def test_local_devices_when_no_tpu_or_cluster(clean_tf_config, capsys):
    strategy = kr.auto(num_replicas=2)
    assert isinstance(strategy, kr.MultiDeviceReplicator)
    assert strategy.num_replicas_in_sync == 2
    assert "2 local logical CPU device(s)" in strategy.selection_reason
    assert "MultiDeviceReplicator with 2 replica(s)" in capsys.readouterr().err


def test_single_worker_tf_config_is_not_a_cluster(clean_tf_config, monkeypatch):
    config = {
        "cluster": {"worker": ["127.0.0.1:1"]},
        "task": {"type": "worker", "index": 0},
    }
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    strategy = kr.auto(num_replicas=1, verbose=False)
    assert isinstance(strategy, kr.MultiDeviceReplicator)


def test_malformed_tf_config_is_reported_before_anything_starts(
    clean_tf_config, monkeypatch
):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["x"]}}')
    with pytest.raises(ValueError, match=r"TF_CONFIG\['cluster'\]\['worker'\]\[0\]"):
        kr.auto(verbose=False)


def test_env_num_replicas(clean_tf_config, monkeypatch):
    monkeypatch.setenv("KERAS_REPLICATOR_NUM_REPLICAS", "two")
    with pytest.raises(ValueError, match="KERAS_REPLICATOR_NUM_REPLICAS='two'"):
        kr.auto(verbose=False)


def test_tpu_hint_reads_only_the_environment(clean_tf_config, monkeypatch):
    assert auto_module.tpu_environment_hint() is None or "device files" in (
        auto_module.tpu_environment_hint()
    )
    monkeypatch.setenv("COLAB_TPU_ADDR", "10.0.0.2:8470")
    assert auto_module.tpu_environment_hint() == "COLAB_TPU_ADDR is set"


def test_slurm_detection(clean_tf_config, monkeypatch):
    assert not auto_module._slurm_cluster()
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert auto_module._slurm_cluster()
