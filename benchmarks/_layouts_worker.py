"""One arm of `layouts.py` in a process of its own: step time and bytes per replica.

Run by the benchmark as `python -m benchmarks._layouts_worker ARM STEPS
STEADY_AFTER` (`ARM` one of `ARMS`), or `ARM STEPS memory` with
`TF_CPU_ALLOCATOR_USE_BFC=true` (`run_memory`); prints `RESULT {json}`. DTensor
(`kr.ModelParallelReplicator`) and `tf.distribute`'s collectives
(`kr.MultiDeviceReplicator`) must never run in one process (docs/layouts.md),
so every arm is a fresh process, the one-device ceiling too (same start-up).

`run`, in order:

1. the MLP is built and compiled with Adam under the arm's strategy, and the
   optimizer built, so its slots exist;
2. bytes per replica of the weights and of Adam's slots (and its two scalars):
   read from the shards (`strategy.bytes_per_device`) for the layout arms, the
   whole size (each replica holds a full copy) for one device and data-parallel;
3. gradients, layout arms: one traced step on a batch split over the mesh (a
   `tf.GradientTape` under the mesh, the model's compiled loss) returns the
   gradients as the tape gives them and as the step hands them to Adam
   (`_step.laid_out_as_variables`, what `fit`'s step calls); their bytes per
   device are read from the returned shards (`dtensor.unpack`);
4. `fit` for `steps` batches of the fixed global batch; the step is the median
   interval between batch ends after batch `steady_after`
   (`harness.steady_interval`).
"""

from __future__ import annotations

import gc
import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness  # noqa: E402

ONE_DEVICE = "one device"
DATA_PARALLEL = "data-parallel 2"
FULLY_SHARDED = "fully sharded 2"
TENSOR_PARALLEL = "tensor parallel 2"
ARMS = (ONE_DEVICE, DATA_PARALLEL, FULLY_SHARDED, TENSOR_PARALLEL)
LAYOUT_ARMS = (FULLY_SHARDED, TENSOR_PARALLEL)
GLOBAL_BATCH = 256
WIDTHS = (784, 2048, 2048, 10)  # 5.8M float32 parameters, 23 MB
THREADS = 2  # intra- and inter-op, every arm: one process on 2 cores


def build(keras):
    """The MLP 784-2048-2048-10 (Dense `hidden_1`, `hidden_2`, `logits`)."""
    layers = [keras.Input((WIDTHS[0],))]
    for index, width in enumerate(WIDTHS[1:-1], start=1):
        dense = keras.layers.Dense(width, activation="relu", name=f"hidden_{index}")
        layers.append(dense)
    layers.append(keras.layers.Dense(WIDTHS[-1], name="logits"))
    return keras.Sequential(layers, name="mlp")


def megatron_map(keras, mesh):
    """Megatron's MLP split: `hidden_1` by columns, `hidden_2` by rows."""
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[".*hidden_1/kernel"] = (None, "model")
    layout_map[".*hidden_1/bias"] = ("model",)
    layout_map[".*hidden_2/kernel"] = ("model", None)
    return layout_map


def strategy_for(arm: str, tf, keras, kr):
    """The arm's strategy (the default one for one device)."""
    if arm == ONE_DEVICE:
        return tf.distribute.get_strategy()
    if arm == DATA_PARALLEL:
        return kr.MultiDeviceReplicator(num_replicas=2)
    if arm == FULLY_SHARDED:
        mesh = keras.distribution.DeviceMesh((2,), ["batch"], kr.devices(2))
        return kr.ModelParallelReplicator(
            keras.distribution.LayoutMap(mesh), fully_shard=True
        )
    if arm == TENSOR_PARALLEL:
        mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], kr.devices(2))
        return kr.ModelParallelReplicator(megatron_map(keras, mesh))
    raise ValueError(f"Unknown arm. Received: arm={arm!r}; expected one of {ARMS}.")


def whole_bytes(variables) -> int:
    """Bytes of `variables` whole (what one replica holds when nothing is split)."""
    import numpy as np

    return sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables)


def read_in_step(tf, mesh, compute, *args) -> list[tuple[list[int], list[str]]]:
    """Per tensor that `compute(*args)` returns traced: bytes per device, layout.

    `compute` runs in a `tf.function` under `mesh`, where every value keeps its
    DTensor layout (an eager read of a laid-out variable may be gathered whole);
    its outputs' shards are read outside (`dtensor.unpack`). A replicated tensor
    counts whole on every device.
    """
    from tensorflow.experimental import dtensor

    with dtensor.default_mesh(mesh):
        outputs = tf.function(compute)(*args)
    return [
        (
            [s.shape.num_elements() * s.dtype.size for s in dtensor.unpack(output)],
            dtensor.fetch_layout(output).sharding_specs,
        )
        for output in outputs
    ]


def _totals(tensors) -> list[int]:
    return [sum(column) for column in zip(*(per_device for per_device, _ in tensors))]


def layout_bytes(tf, strategy, model, x, y) -> dict:
    """Per device bytes of the weights, slots and gradients of a layout arm.

    Weights and Adam's slots: `strategy.bytes_per_device`, and (`*_traced`, a
    check) each variable read in a traced function, where it keeps its layout.
    Gradients of one traced step on a batch split over the mesh (the model's
    compiled loss, `tf.GradientTape`):
    `from_tape` as the tape returns them, `to_optimizer` as `fit`'s step hands
    them to Adam (`_step.laid_out_as_variables`, which it calls).
    """
    from keras_replicator.layouts._step import laid_out_as_variables

    mesh, variables = strategy.mesh, model.trainable_variables
    found = {}
    for name, group in (
        ("weights", model.weights),
        ("slots", model.optimizer.variables),
    ):
        tensors = read_in_step(tf, mesh, _reads(tf, group))
        found[name] = strategy.bytes_per_device(group)
        found[name + "_traced"] = _totals(tensors)
        if name == "weights":
            found["weight_specs"] = {v.path: t[1] for v, t in zip(group, tensors)}
    batches = iter(strategy.experimental_distribute_dataset(_dataset(tf, x, y)))

    # Both in one function: traced alone, the tape's gradients made DTensor
    # refuse the step's BiasAddGrad ("EmitAllScatter was passed a desired_layout
    # ... not more sharded"), as the step itself does not.
    def gradients(features, labels):
        with tf.GradientTape() as tape:
            predictions = model(features, training=True)
            loss = model.compute_loss(x=features, y=labels, y_pred=predictions)
        grads = tape.gradient(loss, variables)
        laid_out = laid_out_as_variables(grads, variables, strategy.batch_dim_name)
        return [*grads, *laid_out]

    tensors = read_in_step(tf, mesh, gradients, *next(batches))
    count, paths = len(variables), [v.path for v in variables]
    for name, part in (
        ("from_tape", tensors[:count]),
        ("to_optimizer", tensors[count:]),
    ):
        found[name] = _totals(part)
        found[name + "_specs"] = {p: t[1] for p, t in zip(paths, part)}
    return found


def _reads(tf, variables):
    return lambda: [tf.identity(v.value) for v in variables]


def _dataset(tf, x, y):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


def _start(arm: str):
    """TensorFlow started for `arm` (2 logical CPUs but for one device), Keras."""
    import keras_replicator as kr

    if arm != ONE_DEVICE:
        kr.split_cpu(2)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    tf.config.threading.set_inter_op_parallelism_threads(THREADS)
    import keras

    return tf, keras, kr


def _compiled(keras, strategy):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = build(keras)
        model.compile(
            keras.optimizers.Adam(1e-4),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.optimizer.build(model.trainable_variables)
    return model


def _data(steps: int):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL_BATCH * steps, WIDTHS[0])).astype("float32")
    return x, rng.integers(0, WIDTHS[-1], GLOBAL_BATCH * steps)


def run(arm: str, steps: int, steady_after: int) -> dict:
    """Bytes per replica from the shards, then the steady `fit` step."""
    tf, keras, kr = _start(arm)
    strategy = strategy_for(arm, tf, keras, kr)
    model = _compiled(keras, strategy)
    x, y = _data(steps)
    weights, slots = model.weights, model.optimizer.variables
    result = {
        "arm": arm,
        "parameters": int(model.count_params()),
        "whole": {
            "weights": whole_bytes(weights),
            "slots": whole_bytes(slots),
            "gradients": whole_bytes(model.trainable_variables),
        },
    }
    if arm in LAYOUT_ARMS:
        result["per_device"] = layout_bytes(tf, strategy, model, x, y)
        result["weight_specs"] = result["per_device"].pop("weight_specs")
    stamp, stamps = harness.batch_end_stamps(keras)
    model.fit(_dataset(tf, x, y), epochs=1, verbose=0, callbacks=[stamp])
    result["step_s"] = harness.steady_interval(stamps, steady_after)
    result["steps"] = len(stamps)
    return result


def run_memory(arm: str, steps: int) -> dict:
    """What TF's CPU allocator holds: after warm-up, and at its peak over `steps`.

    Needs `TF_CPU_ALLOCATOR_USE_BFC=true` (the parent sets it): the BFC
    allocator keeps statistics. Every logical CPU device allocates from it, so
    its numbers are the whole process's (all devices), counted from just before
    the model is built: the model, its slots, what the traced step keeps between
    calls, and at the peak the step's temporaries (activations, gathered
    weights, gradients).
    """
    tf, keras, kr = _start(arm)
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") != "true":
        raise RuntimeError("run_memory needs TF_CPU_ALLOCATOR_USE_BFC=true")
    strategy = strategy_for(arm, tf, keras, kr)
    data = _dataset(tf, *_data(steps))

    def in_use(key="current"):
        gc.collect()
        return tf.config.experimental.get_memory_info("CPU:0")[key]

    before = in_use()
    model = _compiled(keras, strategy)
    built = in_use() - before
    model.fit(data.take(2), epochs=1, verbose=0)
    held = in_use() - before
    tf.config.experimental.reset_memory_stats("CPU:0")
    model.fit(data, epochs=1, verbose=0)
    return {
        "arm": arm,
        "devices": 1 if arm == ONE_DEVICE else 2,
        "built": built,
        "held": held,
        "peak": in_use("peak") - before,
    }


def main() -> None:
    arm, steps = sys.argv[1], int(sys.argv[2])
    if sys.argv[3] == "memory":
        harness.emit_result(run_memory(arm, steps))
    else:
        harness.emit_result(run(arm, steps, int(sys.argv[3])))


if __name__ == "__main__":
    main()
