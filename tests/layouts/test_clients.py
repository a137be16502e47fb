"""Which DTensor clients a worker's environment describes (`layouts/_clients`)."""

import json

import pytest

from keras_replicator.layouts._clients import Clients, cluster_clients


def tf_config(cluster, task_type, index):
    task = {"type": task_type, "index": index}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}


def test_one_process_has_no_clients():
    assert cluster_clients({}) is None
    one = tf_config({"worker": ["127.0.0.1:2222"]}, "worker", 0)
    assert cluster_clients(one) is None


def test_the_chief_comes_first_then_the_workers():
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    assert cluster_clients(tf_config(cluster, "chief", 0)).index == 0
    clients = cluster_clients(tf_config(cluster, "worker", 1))
    assert clients == Clients(("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"), 2)
    assert clients.environment() == {
        "DTENSOR_JOBS": "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        "DTENSOR_CLIENT_ID": "2",
        "DTENSOR_NUM_CLIENTS": "3",
        "DTENSOR_JOB_NAME": "worker",
    }


def test_dtensor_variables_win_over_tf_config():
    environ = {
        **tf_config({"worker": ["127.0.0.1:5", "127.0.0.1:6"]}, "worker", 0),
        "DTENSOR_JOBS": "localhost:7,localhost:8",
        "DTENSOR_CLIENT_ID": "1",
        "DTENSOR_JOB_NAME": "trainer",
    }
    assert cluster_clients(environ) == Clients(
        ("localhost:7", "localhost:8"), 1, "trainer"
    )


@pytest.mark.parametrize("client_id", ["2", "-1", "x"])
def test_a_client_id_outside_the_jobs_is_an_error(client_id):
    environ = {"DTENSOR_JOBS": "localhost:7,localhost:8"}
    environ["DTENSOR_CLIENT_ID"] = client_id
    with pytest.raises(ValueError, match=f"Received: DTENSOR_CLIENT_ID='{client_id}'"):
        cluster_clients(environ)


def test_parameter_servers_are_an_error():
    cluster = {"worker": ["127.0.0.1:2", "127.0.0.1:3"], "ps": ["127.0.0.1:4"]}
    with pytest.raises(ValueError, match="chief and worker tasks only"):
        cluster_clients(tf_config(cluster, "worker", 0))
