"""One process of `weight_update_sharding.py`: state size, update time, `fit` speed.

Run by the benchmark with one JSON argument (the configuration); prints
`RESULT {json}` (worker 0 only, under worker processes). In order:

1. the optimizer is built; the elements and bytes of `optimizer.variables`
   that ONE replica holds are counted (a sharded slot under
   `MultiDeviceReplicator` is a mirrored variable whose device copies each hold
   one piece: the first copy's shape is what a replica holds);
2. "apply": a `tf.function` running `optimizer.apply(grads, weights)` inside
   `strategy.run`, with fixed per-replica gradients made once: the reduction
   plus the optimizer's update, no forward or backward pass. The same with
   `SGD` (no slots) on the same weights is the communication-only reference:
   sharded or not, the ring sends the same bytes, so apply - SGD apply is the
   update's compute;
3. `fit` on random data, the median interval between batches after the first
   `steady_after` (as `step_overhead.py`).

An optimizer that cannot be sharded (the library's "not one of ...
element-wise" `ValueError`) prints `RESULT {"skipped": message}` instead.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness  # noqa: E402

GLOBAL_BATCH = 256
WARMUP_CALLS = 3


def _strategy(tf, kr, config):
    options = kr.AllReduceOptions(shard_weight_update=config["shard"])
    if config["processes"] > 1:
        threads = 1  # 2 processes on 2 cores
    else:
        threads = 2
        kr.split_cpu(4)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    if config["processes"] > 1:
        return kr.MultiWorkerReplicator(all_reduce=options)
    return kr.MultiDeviceReplicator(num_replicas=config["replicas"], all_reduce=options)


def _optimizer(keras, kr, name):
    if name == "adam":
        return keras.optimizers.Adam(1e-4)
    if name == "lars":
        return kr.optimizers.LARS(0.01)
    if name == "sgd":
        return keras.optimizers.SGD(1e-4)
    raise ValueError(f"Unknown optimizer. Received: name={name!r}")


def held_by_one_replica(optimizer) -> tuple[int, int]:
    """Elements and bytes of `optimizer.variables` one replica holds."""
    elements = num_bytes = 0
    for variable in optimizer.variables:
        raw = getattr(variable, "value", variable)
        copies = getattr(raw, "values", None)
        shape = copies[0].shape if copies else raw.shape
        count = math.prod(shape)
        elements += count
        num_bytes += count * _itemsize(variable.dtype)
    return elements, num_bytes


def _itemsize(dtype) -> int:
    import numpy as np

    return np.dtype(getattr(dtype, "name", dtype)).itemsize


def _apply_step(tf, strategy, optimizer, variables):
    @tf.function
    def apply(grads):
        def step(grads):
            optimizer.apply(grads, variables)

        strategy.run(step, args=(grads,))
        return tf.convert_to_tensor(optimizer.iterations)

    return apply


def time_interleaved(steps, calls, warmup=WARMUP_CALLS) -> list[float]:
    """Median seconds of each of `steps` (no-argument callables), called in turn.

    Alternating the steps call by call lets the machine's drift hit them alike.
    """
    for _ in range(warmup):
        for step in steps:
            step()
    times = [[] for _ in steps]
    for _ in range(calls):
        for step, samples in zip(steps, times):
            start = time.perf_counter()
            step()
            samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def _fit_step_seconds(tf, keras, model, config, shape):
    import numpy as np

    steps = config["fit_steps"]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL_BATCH * steps, *shape)).astype("float32")
    y = rng.integers(0, 10, len(x))
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    if config["processes"] > 1:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA
        )
        data = data.with_options(options)
    stamp, stamps = harness.batch_end_stamps(keras)
    model.fit(data, epochs=1, verbose=0, callbacks=[stamp])
    return harness.steady_interval(stamps, config["steady_after"])


def run(config: dict) -> dict:
    import tensorflow as tf

    import keras_replicator as kr

    strategy = _strategy(tf, kr, config)
    import keras

    from benchmarks._models import build_model

    shape = (784,) if config["model"] == "mlp" else (32, 32, 3)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = build_model(keras, config["model"])
        model.compile(
            _optimizer(keras, kr, config["optimizer"]),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.optimizer.build(model.trainable_variables)
        sgd = _optimizer(keras, kr, "sgd")
        sgd.build(model.trainable_variables)
    variables = model.trainable_variables
    elements, num_bytes = held_by_one_replica(model.optimizer)

    def gradients(context):
        replica = context.replica_id_in_sync_group
        return [
            1e-3 * tf.random.stateless_normal(v.shape, [replica, i], dtype=v.dtype)
            for i, v in enumerate(variables)
        ]

    grads = strategy.experimental_distribute_values_from_function(gradients)
    applies = [
        _apply_step(tf, strategy, optimizer, variables)
        for optimizer in (model.optimizer, sgd)
    ]
    try:
        applies[0](grads)  # traced alone first: an unshardable optimizer fails here
    except ValueError as error:
        if "element-wise" not in str(error):
            raise
        return {"skipped": str(error).splitlines()[0][:300]}
    apply_s, sgd_apply_s = time_interleaved(
        [lambda a=a: a(grads).numpy() for a in applies], config["apply_calls"]
    )
    step_s = _fit_step_seconds(tf, keras, model, config, shape)
    return {
        "state_elements": elements,
        "state_bytes": num_bytes,
        "weight_elements": sum(math.prod(v.shape) for v in variables),
        "apply_s": apply_s,
        "sgd_apply_s": sgd_apply_s,
        "fit_step_s": step_s,
    }


def main() -> None:
    result = run(json.loads(sys.argv[1]))
    if int(os.environ.get("KERAS_REPLICATOR_WORKER_INDEX", "0")) == 0:
        harness.emit_result(result)


if __name__ == "__main__":
    main()
