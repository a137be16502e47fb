"""Keras' own optimizer-under-MirroredStrategy tests (keras/src/optimizers/
optimizer_distribute_test.py), with the strategy swapped.

Each replica applies the same gradient through `strategy.run`, eagerly, with an
optimizer created in the scope and built lazily; Keras asserts the resulting values
(the stock contract: the replicas' gradients are summed). The cases compare with
those expected values, at the tolerance each Keras test uses. Only public attributes
are read (the EMA and accumulator slots Keras' tests also inspect are private).
"""

from tests.clients._registry import client_case


@client_case(
    "Keras optimizer_distribute_test: test_single_step (SGD with momentum, one "
    "step on 2 replicas)",
    expected={"variable": [0.0, -4.0, -4.0, 2.0]},
    tolerance=1e-4,
)
def keras_sgd_single_step(strategy, workdir):
    import keras
    import tensorflow as tf

    with strategy.scope():
        optimizer = keras.optimizers.SGD(learning_rate=0.5, momentum=0.06)
        variable = tf.Variable([1.0, 2.0, 3.0, 4.0])

        def update():
            grads = tf.constant([1.0, 6.0, 7.0, 2.0])
            optimizer.apply_gradients(zip([grads], [variable]))

        strategy.run(update)
    return {"variable": variable.numpy()}


@client_case(
    "Keras optimizer_distribute_test: test_weight_decay (three optimizers, "
    "exclusions by name and by variable)",
    expected={"var1": 1.9760959, "var2": 3.0, "var3": 4.0},
    tolerance=1e-6,
)
def keras_sgd_weight_decay(strategy, workdir):
    import keras
    import tensorflow as tf

    with strategy.scope():
        grads = tf.zeros(())
        var1 = keras.Variable(2.0)
        var2 = keras.Variable(3.0, name="exclude")
        var3 = keras.Variable(4.0)
        optimizer_1 = keras.optimizers.SGD(learning_rate=1.0, weight_decay=0.004)
        strategy.run(lambda: optimizer_1.apply_gradients(zip([grads], [var1])))

        optimizer_2 = keras.optimizers.SGD(learning_rate=1.0, weight_decay=0.004)

        def opt2_run():
            optimizer_2.exclude_from_weight_decay(var_names=["exclude"])
            optimizer_2.apply_gradients(zip([grads, grads], [var1, var2]))

        strategy.run(opt2_run)

        optimizer_3 = keras.optimizers.SGD(learning_rate=1.0, weight_decay=0.004)

        def opt3_run():
            optimizer_3.exclude_from_weight_decay(var_list=[var3])
            optimizer_3.apply_gradients(zip([grads, grads], [var1, var3]))

        strategy.run(opt3_run)
    return {"var1": var1.numpy(), "var2": var2.numpy(), "var3": var3.numpy()}


_GOLDEN = [
    [0.9980 - 0.0002 * step - 0.0020 * i for i in range(10)] for step in range(5)
]


@client_case(
    "Keras optimizer_distribute_test: test_correctness_with_golden (SGD, five "
    "steps against golden values)",
    expected={"steps": _GOLDEN},
    tolerance=5e-4,
)
def keras_sgd_golden_values(strategy, workdir):
    import keras
    import numpy as np

    with strategy.scope():
        optimizer = keras.optimizers.SGD(nesterov=True)
        x = keras.Variable(np.ones([10]))

        def update_grads():
            grads = keras.ops.convert_to_tensor(np.arange(0.1, 1.1, 0.1))
            optimizer.apply_gradients(zip([grads], [x]))

        def update_first_grads():
            first_grads = keras.ops.convert_to_tensor(np.full((10,), 0.01))
            optimizer.apply_gradients(zip([first_grads], [x]))

    strategy.run(update_grads)
    steps = []
    for _ in range(5):
        steps.append(keras.ops.convert_to_numpy(x))
        strategy.run(update_first_grads)
    return {"steps": steps}


@client_case(
    "Keras optimizer_distribute_test: test_ema (SGD with an exponential moving "
    "average overwriting the weights)",
    expected={
        "steps": [
            [[2.0, 3.0], [4.0, 5.0]],
            [[1.0, 2.0], [3.0, 4.0]],
            [[1.71, 2.71], [3.71, 4.71]],
        ]
    },
    tolerance=1e-6,
)
def keras_sgd_ema(strategy, workdir):
    import keras

    with strategy.scope():
        v = keras.Variable([[3.0, 4.0], [5.0, 6.0]])
        grads = keras.ops.convert_to_tensor([[1.0, 1.0], [1.0, 1.0]])
        optimizer = keras.optimizers.SGD(
            learning_rate=1.0,
            use_ema=True,
            ema_momentum=0.9,
            ema_overwrite_frequency=3,
        )
        steps = []
        for _ in range(3):
            strategy.run(lambda: optimizer.apply_gradients([(grads, v)]))
            steps.append(keras.ops.convert_to_numpy(v))
    return {"steps": steps}


@client_case(
    "Keras optimizer_distribute_test: test_gradient_accumulation (SGD, "
    "3 accumulation steps)",
    expected={
        "steps": [
            [[1.0, 2.0], [3.0, 4.0]],
            [[1.0, 2.0], [3.0, 4.0]],
            [[-1.0, 0.0], [-1.0, 0.0]],
        ],
        "iterations": [0, 0, 1],
    },
    tolerance=1e-6,
)
def keras_sgd_gradient_accumulation(strategy, workdir):
    import keras

    with strategy.scope():
        v = keras.Variable([[1.0, 2.0], [3.0, 4.0]])
        grads = keras.ops.convert_to_tensor([[1.0, 1.0], [2.0, 2.0]])
        optimizer = keras.optimizers.SGD(
            learning_rate=1.0, gradient_accumulation_steps=3
        )
        steps, iterations = [], []
        for _ in range(3):
            strategy.run(lambda: optimizer.apply_gradients([(grads, v)]))
            steps.append(keras.ops.convert_to_numpy(v))
            iterations.append(int(optimizer.iterations.numpy()))
    return {"steps": steps, "iterations": iterations}
