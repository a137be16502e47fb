"""TensorFlow's "Distributed input" tutorial (tensorflow.org/tutorials/distribute/
input).

`experimental_distribute_dataset` and `distribute_datasets_from_function` (with the
input context's per-replica batch size and sharding), iterated with `for`, with
`iter`/`next`, with `get_next_as_optional` and inside a `tf.function` with the
dataset's `element_spec`; a partial last batch; per-replica results brought back
with `strategy.gather` and `strategy.reduce`; and `fit` on a dataset distributed
from a function.
"""

from tests.clients._data import flat_digits
from tests.clients._registry import client_case

GLOBAL_BATCH = 16
SIZE = 72  # 4 full global batches and a partial one of 8


@client_case(
    "TF tutorial distribute/input: distributed datasets, iterators, "
    "get_next_as_optional, element_spec, partial batch, gather and reduce"
)
def tf_input_distributed_datasets(strategy, workdir):
    import tensorflow as tf

    features = tf.reshape(tf.range(SIZE * 3, dtype=tf.float32), (SIZE, 3)) / 10.0
    dataset = tf.data.Dataset.from_tensor_slices(features).batch(GLOBAL_BATCH)
    dist_dataset = strategy.experimental_distribute_dataset(dataset)

    def replica_fn(batch):
        return tf.reduce_sum(tf.square(batch), axis=1)

    # A Python loop over the distributed dataset.
    totals, gathered = [], []
    for batch in dist_dataset:
        per_replica = strategy.run(replica_fn, args=(batch,))
        totals.append(strategy.reduce("SUM", per_replica, axis=0))
        gathered.append(strategy.gather(per_replica, axis=0))

    # iter/next and get_next_as_optional, inside a tf.function with element_spec.
    @tf.function(input_signature=[dist_dataset.element_spec])
    def sum_of_batch(batch):
        per_replica = strategy.run(replica_fn, args=(batch,))
        return strategy.reduce("SUM", per_replica, axis=0)

    iterator = iter(dist_dataset)
    optional_totals = []
    while True:
        optional = iterator.get_next_as_optional()
        if not optional.has_value():
            break
        optional_totals.append(sum_of_batch(optional.get_value()))

    # distribute_datasets_from_function with the input context.
    def dataset_fn(input_context):
        batch_size = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
        local = tf.data.Dataset.from_tensor_slices(features)
        local = local.shard(
            input_context.num_input_pipelines, input_context.input_pipeline_id
        )
        return local.batch(batch_size)

    from_function = strategy.distribute_datasets_from_function(dataset_fn)
    function_totals = []
    for batch in from_function:
        per_replica = strategy.run(replica_fn, args=(batch,))
        function_totals.append(strategy.reduce("SUM", per_replica, axis=0))
    return {
        "totals": totals,
        "gathered": gathered,
        "optional_totals": optional_totals,
        "function_totals": float(tf.add_n(function_totals)),
    }


@client_case(
    "TF tutorial distribute/input: fit on distribute_datasets_from_function "
    "(per-replica batch from the input context)"
)
def tf_input_fit_from_function(strategy, workdir):
    import keras
    import tensorflow as tf

    (x, y), _ = flat_digits()

    def dataset_fn(input_context):
        batch_size = input_context.get_per_replica_batch_size(64)
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        dataset = dataset.shard(
            input_context.num_input_pipelines, input_context.input_pipeline_id
        )
        return dataset.batch(batch_size).repeat()

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    history = model.fit(
        strategy.distribute_datasets_from_function(dataset_fn),
        epochs=2,
        steps_per_epoch=8,
        verbose=0,
    )
    return {"weights": model.get_weights(), "loss": history.history["loss"]}
