"""`--devices N`: flat vs hierarchical all-reduce on N logical CPUs, one process.

No worker processes: the N replicas of one `MultiDeviceReplicator` reduce the
ResNet-50 gradient set flat and with both hierarchies (rows of N/2 devices), next
to a memcpy of the same bytes for scale.
"""

from __future__ import annotations

import time

from benchmarks import harness
from benchmarks._allreduce_common import MB, resnet50_gradients


def devices_worker(num_devices: int, rounds: int) -> None:
    """One process, `num_devices` logical CPUs: flat vs hierarchical all-reduce."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices
    )
    import keras_replicator as kr
    from keras_replicator.communication import _all_reduce

    strategy = kr.MultiDeviceReplicator(num_replicas=num_devices)
    grads, total_bytes = resnet50_gradients(strategy)
    half = num_devices // 2
    configs = {
        "memcpy (concat)": None,
        "ours default (flat)": kr.AllReduceOptions(),
        f"local_then_global g={half}": kr.AllReduceOptions(
            hierarchy="local_then_global", group_size=half
        ),
        f"2d g={half}": kr.AllReduceOptions(hierarchy="2d", group_size=half),
    }

    def make(options):
        def replica_fn():
            values = [g.read_value() for g in grads]
            if options is None:  # every replica copies its bytes once
                return tf.concat([tf.reshape(v, [-1]) for v in values], 0)[0]
            out, _ = _all_reduce.all_reduce_sum(values, options=options)
            return tf.add_n([tf.reshape(o, [-1])[0] for o in out])

        return tf.function(lambda: strategy.run(replica_fn))

    functions = {name: make(o) for name, o in configs.items()}
    for f in functions.values():
        f()
    times = {name: [] for name in functions}
    for _ in range(rounds):
        for name, f in functions.items():
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    print(
        f"\n{num_devices} logical CPU devices, one process, {total_bytes / MB:.0f} MB"
    )
    median = harness.medians(times)
    ratio = harness.ratios(median, "ours default (flat)")
    print(f"{'method':<28} {'ms':>8} {'/ flat':>8}")
    for name, m in median.items():
        print(f"{name:<28} {m * 1e3:>8.1f} {ratio[name]:>8.2f}")
