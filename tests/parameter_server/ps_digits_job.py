"""A parameter-server job on the digits task, run by test_parameter_server*.py.

Same script on every task (`keras-replicator launch -n 2 --ps 1`): on workers and
parameter servers `kr.auto()` serves and blocks. On the chief it trains the same
model on one device and then asynchronously, and prints one JSON line.
Environment: KR_TEST_EPOCHS, KR_TEST_INPUT ("arrays", the default, or "dataset":
fit / evaluate / predict on `tf.data.Dataset`s made on the chief), KR_TEST_KILL
("worker 1:2" = the chief SIGKILLs that task at step 10 of epoch 2, mid-epoch, by
the pid file it wrote), KR_TEST_STOP (the same, with SIGSTOP: a hung task),
KR_TEST_CHECKPOINT (a ModelCheckpoint path).
"""

import json
import os
import signal
import sys

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import keras_replicator as kr

task = json.loads(os.environ["TF_CONFIG"])["task"]
with open(f"{task['type']}{task['index']}.pid", "w") as pid_file:
    pid_file.write(str(os.getpid()))

strategy = kr.auto(verbose=False)  # Blocks on worker and ps tasks.
assert isinstance(strategy, kr.ParameterServerReplicator), strategy

epochs = int(os.environ.get("KR_TEST_EPOCHS", "8"))
digits = load_digits()
x = (digits.data / 16).astype("float32")
y = digits.target.astype("int32")
order = np.random.default_rng(0).permutation(len(x))
x, y = x[order], y[order]
x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]


def build(learning_rate=3e-3):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=2,
    )
    return model


one_device_accuracy = float("nan")
if os.environ.get("KR_TEST_ONE_DEVICE", "1") == "1":
    one_device = build()
    one_device.fit(x_train, y_train, batch_size=32, epochs=epochs, verbose=0)
    _, one_device_accuracy = one_device.evaluate(x_test, y_test, verbose=0)

with strategy.scope():
    # docs/async.md: with W workers a gradient is about W - 1 updates stale;
    # dividing the learning rate by W keeps the step per unit of staleness.
    model = build(3e-3 / strategy.num_workers)
callbacks = []


class KillTask(keras.callbacks.Callback):
    """SIGKILLs a worker or ps mid-epoch, while steps are in flight."""

    def __init__(self, spec, signal_number=signal.SIGKILL):
        super().__init__()
        self.signal_number = signal_number
        name, epoch = spec.split(":")
        self.pid_file = name.replace(" ", "") + ".pid"
        self.kill_epoch = int(epoch)
        self.epoch = -1

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch == self.kill_epoch and batch == 10:
            with open(self.pid_file) as pid_file:
                os.kill(int(pid_file.read()), self.signal_number)
            print(f"sent {self.signal_number!r} to {self.pid_file}", flush=True)


if os.environ.get("KR_TEST_KILL"):
    callbacks.append(KillTask(os.environ["KR_TEST_KILL"]))
if os.environ.get("KR_TEST_STOP"):
    callbacks.append(KillTask(os.environ["KR_TEST_STOP"], signal.SIGSTOP))
if os.environ.get("KR_TEST_CHECKPOINT"):
    callbacks.append(
        keras.callbacks.ModelCheckpoint(
            os.environ["KR_TEST_CHECKPOINT"], save_weights_only=True
        )
    )
if os.environ.get("KR_TEST_INPUT", "arrays") == "dataset":
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    train = train.shuffle(len(x_train)).batch(32)
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(32)
    fit_data = {"x": train, "validation_data": test}
    evaluate_data = {"x": test}
    predict_data = tf.data.Dataset.from_tensor_slices(x_test).batch(32)
else:
    fit_data = {"x": x_train, "y": y_train, "validation_data": (x_test, y_test)}
    evaluate_data = {"x": x_test, "y": y_test}
    predict_data = x_test
history = model.fit(
    **fit_data,
    batch_size=None if "y" not in fit_data else 32,
    epochs=epochs,
    callbacks=callbacks,
    verbose=2,
)
loss, accuracy = model.evaluate(**evaluate_data)
predicted = model.predict(predict_data)
print(
    "RESULT "
    + json.dumps(
        {
            "one_device_accuracy": float(one_device_accuracy),
            "accuracy": float(accuracy),
            "predict_accuracy": float((predicted.argmax(1) == y_test).mean()),
            "predict_rows": int(len(predicted)),
            "val_accuracy": history.history["val_accuracy"][-1],
        }
    ),
    flush=True,
)
sys.exit(0)
