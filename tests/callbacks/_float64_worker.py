"""The start of the worker scripts of the multi-worker preemption tests.

A float64 MLP with an `ExponentialDecay` schedule and momentum, on a
`MultiWorkerReplicator` (socket ring, `shard_weight_update`, or TF's collectives,
by `sys.argv[3]`) under `TF_CONFIG`, else on one device: the reference. Defines
`x`, `y`, `model`, `strategy`, `worker`, `workers`; each test appends its own part.
"""

import textwrap

PRELUDE = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras, numpy as np
    import keras_replicator as kr
    keras.backend.set_floatx("float64")
    which = sys.argv[3]  # "ours" (the socket ring), "sharded", "collective", "keras"
    worker = int(os.environ.get("KERAS_REPLICATOR_WORKER_INDEX", "0"))
    workers = int(os.environ.get("KERAS_REPLICATOR_NUM_WORKERS", "1"))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(96, 6)), rng.normal(size=(96, 1))
    options = {"collective": kr.AllReduceOptions(transport="collective"),
               "sharded": kr.AllReduceOptions(shard_weight_update=True)}
    if "TF_CONFIG" in os.environ:
        strategy = kr.MultiWorkerReplicator(all_reduce=options.get(which))
    else:
        strategy = tf.distribute.get_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
        decay = keras.optimizers.schedules.ExponentialDecay(0.1, 4, 0.5)
        model.compile(keras.optimizers.SGD(decay, momentum=0.5), "mse")
    """
)
