"""`image_pipeline` on a real tf.data service: a dispatcher and 2 workers on loopback.

The servers run in this process (`start_local_service`), each a real gRPC server
on 127.0.0.1; `tests/launch/test_data_service.py` runs them as processes beside
launched training workers.
"""

import collections
import threading

import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.data import (
    digit_images,
    image_pipeline,
    service,
    write_image_tfrecords,
)

N = 48  # label i is image i's id


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("jpeg_service")
    images, _ = digit_images(N, 32)
    write_image_tfrecords(images, np.arange(N), str(directory), 6)
    return str(directory / "*.tfrecord")


@pytest.fixture(scope="module")
def local_service():
    return service.start_local_service(num_workers=2)


def _labels(dataset):
    # A consumer may get no batch at all: in "distributed_epoch" mode the service
    # hands splits to whoever asks first (once under a loaded `make test`, one
    # consumer read the whole epoch before the other connected).
    return np.concatenate([labels.numpy() for _, labels in dataset] + [[]]).astype(int)


def _eval(shards, local_service, mode, job_name):
    return image_pipeline(
        shards,
        batch_size=4,
        image_size=16,
        training=False,
        seed=0,
        cache=mode == "parallel_epochs",
        data_service=local_service.address,
        processing_mode=mode,
        job_name=job_name,
    )


def test_distributed_epoch_two_consumers_see_every_example_exactly_once(
    shards, local_service
):
    # Two consumers (as two training workers would) share one job served by two
    # service workers; each pass over the files is split among all of them.
    for epoch in range(2):
        seen = [None, None]

        def consume(i, seen=seen, job=f"de{epoch}"):
            seen[i] = _labels(_eval(shards, local_service, "distributed_epoch", job))

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads)
        together = np.concatenate(seen)
        assert sorted(together.tolist()) == list(range(N))  # exactly once


def test_distributed_epoch_next_iteration_is_the_next_epoch(shards, local_service):
    dataset = _eval(shards, local_service, "distributed_epoch", "again")
    for _ in range(2):
        assert sorted(_labels(dataset).tolist()) == list(range(N))


def test_parallel_epochs_runs_the_whole_pipeline_on_every_service_worker(
    shards, local_service
):
    labels = _labels(_eval(shards, local_service, "parallel_epochs", "pe"))
    counts = collections.Counter(labels.tolist())
    assert set(counts) == set(range(N)) and set(counts.values()) == {2}


def test_training_batches_from_the_service_keep_shape_dtype_and_epochs(
    shards, local_service
):
    dataset = image_pipeline(
        shards,
        batch_size=8,
        image_size=16,
        training=True,
        seed=0,
        cache=False,
        dtype="bfloat16",
        data_service=local_service.address,
    )
    assert dataset.element_spec[0].shape.as_list() == [8, 16, 16, 3]
    assert dataset.element_spec[0].dtype == tf.bfloat16
    labels = _labels(dataset.take(4 * N // 8))  # four epochs' worth of batches
    counts = collections.Counter(labels.tolist())
    # Once per epoch: 4 times each, give or take the one epoch in flight when
    # the count stops (the two service workers' streams interleave there).
    assert set(counts) == set(range(N)) and set(counts.values()) <= {3, 4, 5}
    assert len(labels) == 4 * N


def test_a_cache_would_replay_files_so_distributed_epoch_refuses_it(shards):
    with pytest.raises(ValueError, match="`cache` must be False with processing"):
        image_pipeline(
            shards,
            batch_size=8,
            image_size=16,
            training=True,
            seed=0,
            data_service="grpc://127.0.0.1:1",
        )


def test_fit_on_two_replicas_reading_from_the_service(shards, local_service):
    import keras

    strategy = kr.MultiDeviceReplicator(num_replicas=2)

    def input_fn(context):
        return image_pipeline(
            shards,
            batch_size=context.get_per_replica_batch_size(16),
            image_size=16,
            training=True,
            seed=1,
            cache=False,
            input_context=context,
            data_service=local_service.address,
        )

    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((16, 16, 3)), keras.layers.Flatten(), keras.layers.Dense(N)]
        )
        model.compile(
            keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    history = model.fit(
        strategy.distribute_datasets_from_function(input_fn),
        steps_per_epoch=3,
        verbose=0,
    )
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"seed": None}, ValueError, "`seed` must be set with `data_service`"),
        ({"cache": "/tmp/c"}, ValueError, "`cache` must be True or False"),
        ({"processing_mode": "epochs"}, ValueError, "processing_mode='epochs'"),
        ({"data_service": "http://x:1"}, ValueError, "data_service='http://x:1'"),
        ({"data_service": "localhost"}, ValueError, "data_service='localhost'"),
        ({"data_service": 5050}, TypeError, "data_service=5050"),
    ],
)
def test_bad_service_arguments_name_the_argument(shards, kwargs, error, match):
    options = dict(
        batch_size=4,
        image_size=16,
        training=True,
        seed=0,
        cache=False,
        data_service="grpc://127.0.0.1:1",
    )
    options.update(kwargs)
    with pytest.raises(error, match=match):
        image_pipeline(shards, **options)


def test_service_address_reads_the_launchers_variable():
    assert service.service_address({}) is None
    env = {service.SERVICE_ENV: "127.0.0.1:5050"}
    assert service.service_address(env) == "grpc://127.0.0.1:5050"
    with pytest.raises(ValueError, match="KERAS_REPLICATOR_DATA_SERVICE"):
        service.service_address({service.SERVICE_ENV: "no port"})


def test_distribute_checks_its_arguments(local_service):
    dataset = tf.data.Dataset.range(4)
    with pytest.raises(TypeError, match="`dataset` must be a tf.data.Dataset"):
        service.distribute([1, 2], local_service.address)
    with pytest.raises(ValueError, match="job_name=''"):
        service.distribute(dataset, local_service.address, job_name="")
    served = service.distribute(
        dataset, local_service.address, processing_mode="parallel_epochs"
    )
    assert sorted(served.as_numpy_iterator()) == [0, 0, 1, 1, 2, 2, 3, 3]
