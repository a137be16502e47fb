"""TF's PS tutorial's custom training loop on a real cluster, counted exactly.

A chief, 2 workers and 2 parameter servers on 127.0.0.1 (`launch --ps 2`) run
`ps_custom_loop_job.py`: the tutorial's loop of `coordinator.schedule(step_fn)`
x 5 per epoch, `join()`, and `accuracy.update_state` on the workers. Keras 3's
`assign_add` is a read then a write, so concurrent workers lost increments
(counts of 96 where 160 examples were scored, `optimizer.iterations` 15 of 21);
every scheduled step must now be counted. With the tutorial's
`variable_partitioner`, Keras 3 cannot train the sharded embedding; the chief
must say so when the model is built, naming the argument.
"""

import json
import sys
from pathlib import Path

import pytest

from keras_replicator.launch import launch

JOB = Path(__file__).with_name("ps_custom_loop_job.py")


def run_job(tmp_path, env=None, num_workers=2):
    return launch(
        [sys.executable, str(JOB)],
        num_workers,
        num_ps=2,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
        timeout=150,
        cwd=str(tmp_path),
        echo=False,
        grace_seconds=3.0,
    )


@pytest.mark.multi_worker
@pytest.mark.timeout(200)
def test_the_tutorials_custom_loop_counts_every_example_and_step(tmp_path):
    result = run_job(tmp_path)
    assert result.ok, result.describe_failure()
    chief = result.workers[result.job_index].output
    lines = [line for line in chief.splitlines() if line.startswith("RESULT ")]
    assert lines, result.describe_failure()
    numbers = json.loads(lines[-1][len("RESULT ") :])
    # 4 epochs x 5 steps x 32 examples, then one more step for the final loss.
    assert numbers == {"counts": [160, 160, 160, 160], "iterations": 21}, numbers


@pytest.mark.slow  # Another cluster start (~25 s of CPU) for one error message.
@pytest.mark.multi_worker
@pytest.mark.timeout(200)
def test_a_partitioner_that_shards_a_keras_variable_is_refused_clearly(tmp_path):
    result = run_job(tmp_path, env={"KR_TEST_PARTITION": "1"}, num_workers=1)
    assert not result.ok and not result.timed_out, result.describe_failure()
    chief = result.workers[result.job_index].output
    assert (
        "ValueError: `variable_partitioner` cannot shard Keras 3 variables" in chief
    ), result.describe_failure()
    assert "variable_partitioner=MinSizePartitioner(...)" in chief
    assert "split `embedding/embeddings` (shape (7, 16384)) into 2 parts" in chief
    assert "'ShardedVariable' object has no attribute 'handle'" not in chief.replace(
        "fail with \"'ShardedVariable' object has no attribute 'handle'\"", ""
    )
