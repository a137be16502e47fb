"""Does the large-batch recipe hold? 16x batch vs a small-batch baseline, same epochs.

Trains an MLP on scikit-learn's bundled digits (1,797 8x8 images, no download) for the
same number of epochs with:

- baseline: batch 32, SGD with momentum, learning rate `--base-learning-rate`;
- (a) batch 512 (16x), SGD, learning rate scaled linearly (Goyal et al.), no warmup;
- (b) as (a) with a gradual warmup (Goyal et al.: from the base rate, 5 epochs);
- (c) as (b) with LARS (You et al. 2017) instead of SGD, same peak rate and warmup.

Every configuration uses the same polynomial (power 2) decay to 0 after its warmup
(`PolynomialDecayWithWarmup`, the MLPerf schedule), so only the recipe changes. The
baseline runs on one device; the 16x runs on `MultiDeviceReplicator(num_replicas=2)`
(2 logical CPUs, 256 examples per replica), which gives one-device numbers at the same
global batch (`--replicas 1` runs them on one device; 2 replicas are slower here, about
1 s per epoch of input overhead). Test accuracy is the mean over `--seeds` seeds, with
the difference and ratio against the baseline measured in the same run.

LARS keeps the SGD peak rate (biases are excluded from adaptation and need an SGD-sized
rate) and uses `eeta=0.05`, picked by `--tune` on a validation split carved from the
training data (never the test set).

    python -m benchmarks.large_batch [--seeds 3] [--epochs 30] [--replicas 2]
    python -m benchmarks.large_batch --tune    # pick LARS' eeta on a validation split

Prints a table and saves a plot to benchmarks/results/large_batch.png.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Config:
    name: str
    batch_size: int
    optimizer: str  # "sgd" or "lars"
    peak_learning_rate: float
    warmup_epochs: float
    distributed: bool


@dataclass
class Run:
    test_accuracy: list[float]  # per epoch
    loss: list[float]  # per epoch
    seconds: float
    trust_ratios: dict[str, float]


def load_digits_split(validation: bool, seed: int = 0):
    """Train/test split of digits; with `validation`, a split of the train part."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    y = y.astype("int32")
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, stratify=y, random_state=seed
    )
    if validation:  # never look at the test set when choosing hyperparameters
        x_train, x_test, y_train, y_test = train_test_split(
            x_train, y_train, test_size=0.25, stratify=y_train, random_state=seed
        )
    return (x_train, y_train), (x_test, y_test), np.unique(y).size


def build_model(keras, num_classes: int):
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(128, activation="relu", name="hidden_1"),
            keras.layers.Dense(128, activation="relu", name="hidden_2"),
            keras.layers.Dense(num_classes, name="logits"),
        ],
        name="mlp",
    )


def train(
    config: Config,
    seed: int,
    data,
    *,
    epochs: int,
    eeta: float,
    strategy,
    start_learning_rate: float,
) -> Run:
    import keras
    import numpy as np

    from keras_replicator.callbacks import TrustRatioLogger
    from keras_replicator.optimizers import LARS
    from keras_replicator.schedules import PolynomialDecayWithWarmup

    (x_train, y_train), (x_test, y_test), num_classes = data
    steps_per_epoch = -(-len(x_train) // config.batch_size)
    warmup_steps = round(config.warmup_epochs * steps_per_epoch)
    schedule = PolynomialDecayWithWarmup(
        config.peak_learning_rate,
        warmup_steps=warmup_steps,
        decay_steps=epochs * steps_per_epoch - warmup_steps,
        end_learning_rate=0.0,
        start_learning_rate=start_learning_rate if warmup_steps else 0.0,
    )
    callbacks = []
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        model = build_model(keras, num_classes)
        if config.optimizer == "lars":
            optimizer = LARS(schedule, momentum=0.9, eeta=eeta)
            callbacks.append(TrustRatioLogger(groups="layer"))
        else:
            optimizer = keras.optimizers.SGD(schedule, momentum=0.9)
        model.compile(
            optimizer,
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    start = time.perf_counter()
    history = model.fit(
        x_train,
        y_train,
        batch_size=config.batch_size,
        epochs=epochs,
        validation_data=(x_test, y_test),
        callbacks=callbacks,
        verbose=0,
    ).history
    seconds = time.perf_counter() - start
    ratios = {
        key.split("/")[2]: values[-1]
        for key, values in history.items()
        if key.startswith("trust_ratio/")
    }
    loss = [value if np.isfinite(value) else float("nan") for value in history["loss"]]
    return Run(history["val_accuracy"], loss, seconds, ratios)


def configurations(base_learning_rate: float, warmup_epochs: float, replicas: int):
    from keras_replicator.schedules import scaled_learning_rate

    large = 512
    scaled = scaled_learning_rate(base_learning_rate, large, base_batch_size=32)
    distributed = replicas > 1
    return [
        Config("baseline", 32, "sgd", base_learning_rate, 0, False),
        Config("(a) SGD, linear scaling", large, "sgd", scaled, 0, distributed),
        Config("(b) SGD + warmup", large, "sgd", scaled, warmup_epochs, distributed),
        Config("(c) LARS + warmup", large, "lars", scaled, warmup_epochs, distributed),
    ]


def print_table(configs, runs, seeds, *, metric="test acc"):
    final = {
        c.name: [run.test_accuracy[-1] * 100 for run in runs[c.name]] for c in configs
    }
    stats = harness.over_seeds(final, configs[0].name)
    header = (
        f"{'configuration':<26} {'batch':>5} {'opt':>4} {'peak lr':>8} "
        f"{'warmup':>7} {metric + ' %':>16} {'diff':>6} {'ratio':>6} {'s/run':>6}"
    )
    lines = []
    for config in configs:
        s = stats[config.name]
        seconds = statistics.mean(run.seconds for run in runs[config.name])
        warmup = f"{config.warmup_epochs:g} ep" if config.warmup_epochs else "-"
        lines.append(
            f"{config.name:<26} {config.batch_size:>5} {config.optimizer:>4} "
            f"{config.peak_learning_rate:>8.3g} {warmup:>7} "
            f"{s['mean']:>9.2f} ± {s['std']:<4.2f} {s['diff']:>+6.2f} "
            f"{s['ratio']:>6.3f} {seconds:>6.1f}"
        )
    note = f"(mean ± std over {len(seeds)} seeds: {', '.join(map(str, seeds))})"
    harness.print_table(header, lines, note)


def plot(configs, runs, path: Path, epochs: int) -> None:
    title = "digits MLP: 16x batch vs batch 32, same epochs"
    drawing = harness.figure(path, size=(11, 4), panels=2, dpi=120, title=title)
    with drawing as (_, (accuracy_axis, loss_axis)):
        _draw(configs, runs, epochs, accuracy_axis, loss_axis)


def _draw(configs, runs, epochs: int, accuracy_axis, loss_axis) -> None:
    import numpy as np

    x = np.arange(1, epochs + 1)
    for config in configs:
        accuracy = np.array([run.test_accuracy for run in runs[config.name]]) * 100
        loss = np.array([run.loss for run in runs[config.name]])
        label = f"{config.name} (batch {config.batch_size})"
        line = accuracy_axis.plot(x, accuracy.mean(0), label=label)[0]
        accuracy_axis.fill_between(
            x, accuracy.min(0), accuracy.max(0), color=line.get_color(), alpha=0.15
        )
        loss_axis.plot(x, np.nanmean(loss, 0), color=line.get_color(), label=label)
    accuracy_axis.set(xlabel="epoch", ylabel="test accuracy % (mean, min-max)")
    accuracy_axis.set_ylim(50, 100)
    accuracy_axis.legend(loc="lower right", fontsize=8)
    loss_axis.set(xlabel="epoch", ylabel="training loss (mean)", yscale="log")


def tune_eeta(args, strategy) -> None:
    """Validation accuracy of (c) for several trust coefficients (no test data)."""
    data = load_digits_split(validation=True)
    base = configurations(args.base_learning_rate, args.warmup_epochs, args.replicas)
    lars = base[-1]
    print(
        f"LARS + warmup, batch 512, validation split of the training data, "
        f"seeds {list(range(3))}"
    )
    for eeta in (0.005, 0.01, 0.02, 0.05, 0.1):
        accuracies = [
            train(
                lars,
                seed,
                data,
                epochs=args.epochs,
                eeta=eeta,
                strategy=strategy,
                start_learning_rate=args.base_learning_rate,
            ).test_accuracy[-1]
            * 100
            for seed in range(3)
        ]
        print(f"eeta={eeta:<6g} validation accuracy {statistics.mean(accuracies):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument(
        "--replicas",
        type=int,
        default=2,
        help="replicas for the 16x runs (1: one device)",
    )
    parser.add_argument("--base-learning-rate", type=float, default=0.05)
    parser.add_argument("--warmup-epochs", type=float, default=5)
    parser.add_argument(
        "--eeta", type=float, default=0.05, help="LARS trust coefficient (see --tune)"
    )
    parser.add_argument(
        "--tune", action="store_true", help="sweep eeta on a validation split and exit"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "large_batch.png")
    args = parser.parse_args()
    if not 0 <= args.warmup_epochs < args.epochs:
        parser.error(
            f"--warmup-epochs must be in [0, --epochs). Received: "
            f"--warmup-epochs={args.warmup_epochs:g}, --epochs={args.epochs}."
        )

    import keras_replicator as kr

    if args.replicas > 1:
        kr.split_cpu(args.replicas)
    import tensorflow as tf

    one_device = tf.distribute.get_strategy()
    replicated = (
        kr.MultiDeviceReplicator(num_replicas=args.replicas)
        if args.replicas > 1
        else one_device
    )
    if args.tune:
        tune_eeta(args, replicated)
        return

    data = load_digits_split(validation=False)
    configs = configurations(args.base_learning_rate, args.warmup_epochs, args.replicas)
    seeds = list(range(args.seeds))
    runs = {config.name: [] for config in configs}
    for seed in seeds:  # seed-major, so machine noise hits all configurations alike
        for config in configs:
            runs[config.name].append(
                train(
                    config,
                    seed,
                    data,
                    epochs=args.epochs,
                    eeta=args.eeta,
                    strategy=replicated if config.distributed else one_device,
                    start_learning_rate=args.base_learning_rate,
                )
            )
    print(
        f"digits: {len(data[0][0])} train / {len(data[1][0])} test examples, "
        f"{args.epochs} epochs, 16x runs on "
        + (f"{args.replicas} replicas" if args.replicas > 1 else "one device")
        + f", LARS eeta={args.eeta:g}"
    )
    print_table(configs, runs, seeds)
    lars_runs = runs[configs[-1].name]
    if lars_runs[0].trust_ratios:
        ratios = ", ".join(
            f"{layer} {value:.3g}" for layer, value in lars_runs[0].trust_ratios.items()
        )
        print(
            f"LARS trust ratios at the last step (seed 0; the gradients and the "
            f"learning rate are near 0 by then): {ratios}"
        )
    plot(configs, runs, args.output, args.epochs)
    print(f"plot: {args.output}")


if __name__ == "__main__":
    main()
