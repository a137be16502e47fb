"""Large-batch optimizers on mnist1d: SGD, LARS, LAMB, Neumann and NLCG, x1 to extreme.

The digits benchmark (`large_batch.py`) is too easy to separate the recipes: SGD
with linear scaling loses only 3 points at 16x. mnist1d (Greydanus 2020, `pip
install mnist1d`) is a 1-D, 40-sample analogue of MNIST, generated offline by
`mnist1d.data.make_dataset` (no download), on which an MLP reaches well below
100%, so batch size and optimizer matter while a run still takes seconds on CPU.

Every recipe trains the same MLP for the same number of epochs at each batch
`32 * multiplier` (`--multipliers`, default `1,16,32,extreme`; "extreme" is half of
the training set, NLCG's regime), over `--seeds` seeds (mean +- std):

- `SGD`: momentum 0.9, learning rate scaled linearly (Goyal et al. 2017), no
  warmup; the `SGD` row at x1 is the baseline every row is compared with
  (difference and ratio measured in the same run);
- `SGD + warmup`, `LARS + warmup` (You et al. 2017, `eeta=--eeta`, coupled
  `--lars-weight-decay`): the same peak rate after a linear warmup of
  `--warmup-epochs`;
- `LAMB + warmup` (`keras.optimizers.Lamb`, You et al. 2019): its own base rate
  `--lamb-learning-rate`, scaled by the square root of the multiplier;
- `Neumann` (Krishnan et al. 2017): the SGD peak rate and warmup (or
  `--neumann-learning-rate`, scaled linearly), `mu_steps` one epoch, first reset
  after `--neumann-reset-epochs` epochs, `beta=--neumann-beta` (1e-7: the paper's
  1e-5 per parameter makes the repulsive term `beta * n / rho**3` explode while
  `w - v` is still small, and this MLP's loss was NaN at base rates 0.05, 0.01 and
  0.002 at x16; 1e-7 and 0 train); evaluated on its true weights (`fit` ends with
  them);
- `NLCG` (Adya et al. 2018): the SGD peak rate and warmup, diagonal-BFGS
  preconditioner and the loss-trend step control, which `fit` feeds
  (`--nlcg-variant`: one row per step-control timing, see docs/optimizers.md).

All rates decay to 0 with the power-2 polynomial schedule after their warmup
(`PolynomialDecayWithWarmup`), so only the recipe changes. Runs are on one device:
the library's replicators train to one device's weights (tests/optimizers), so the
numbers hold for any replica count at the same global batch.

How the defaults were picked without the test set (`--validation` trains on the
first 80% of the training split and scores the last 20%): docs/optimizers.md, "How
LARS' values were picked" (LARS and the shared warmup; the other rates: as given).

    python -m benchmarks.large_batch_optimizers [--seeds 5] [--epochs 30]
    python -m benchmarks.large_batch_optimizers --validation --seeds 2 \\
        --multipliers 16,32 --recipes "LARS + warmup" --eeta 0.02

Needs `mnist1d` (the `demo` extra). Prints a table and saves a bar plot and the
numbers (`.json`) to benchmarks/large_batch_optimizers.png (none with
`--validation` unless `--output` is given).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness  # noqa: E402

HERE = Path(__file__).resolve().parent  # results beside the script, as the others
BASE_BATCH = 32
RECIPES = ("SGD", "SGD + warmup", "LARS + warmup", "LAMB + warmup", "Neumann", "NLCG")


@dataclass(frozen=True)
class Config:
    recipe: str
    multiplier: float
    batch_size: int
    peak_learning_rate: float
    warmup_epochs: float
    variant: str | None = None  # NLCG's reverted timing parts (None: the default)

    @property
    def label(self) -> str:
        return self.recipe if self.variant is None else f"NLCG [{self.variant}]"

    @property
    def name(self) -> str:
        return f"{self.label} @ batch {self.batch_size}"


def split_validation(data, fraction: float):
    """((x_fit, y_fit), (x_val, y_val)): `--validation`'s split, the last `fraction`
    of the training split held out (to choose hyperparameters without the test set).
    """
    (x_train, y_train), _ = data
    cut = len(x_train) - round(fraction * len(x_train))
    return (x_train[:cut], y_train[:cut]), (x_train[cut:], y_train[cut:])


def load_mnist1d(num_samples: int, seed: int = 42):
    """mnist1d made offline: ((x_train, y_train), (x_test, y_test))."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as error:
        raise SystemExit(
            "This benchmark needs mnist1d: `pip install -e .[demo]` (or "
            "`pip install mnist1d==0.0.2.post1`)."
        ) from error
    args = get_dataset_args()
    args.num_samples, args.seed = num_samples, seed
    data = make_dataset(args)  # generates; `get_dataset` would download
    train = (data["x"].astype("float32"), data["y"].astype("int32"))
    test = (data["x_test"].astype("float32"), data["y_test"].astype("int32"))
    return train, test


def build_model(keras):
    return keras.Sequential(
        [
            keras.Input((40,)),
            keras.layers.Dense(256, activation="relu", name="hidden_1"),
            keras.layers.Dense(256, activation="relu", name="hidden_2"),
            keras.layers.Dense(10, name="logits"),
        ],
        name="mlp",
    )


def make_optimizer(config: Config, schedule, args, steps_per_epoch: int):
    import keras

    from keras_replicator.optimizers import LARS, NLCG, Neumann

    if config.recipe.startswith("SGD"):
        return keras.optimizers.SGD(schedule, momentum=0.9)
    if config.recipe.startswith("LARS"):
        return LARS(
            schedule, momentum=0.9, eeta=args.eeta, weight_decay=args.lars_weight_decay
        )
    if config.recipe.startswith("LAMB"):
        return keras.optimizers.Lamb(schedule)
    if config.recipe == "Neumann":
        return Neumann(
            schedule,
            beta=args.neumann_beta,
            mu_steps=steps_per_epoch,
            reset_steps=max(1, round(args.neumann_reset_epochs * steps_per_epoch)),
        )
    return NLCG(schedule)


def train(config: Config, seed: int, data, args) -> dict:
    import keras
    import numpy as np

    from keras_replicator.optimizers import UseTrueWeights, _nlcg_steps
    from keras_replicator.schedules import PolynomialDecayWithWarmup

    (x_train, y_train), (x_test, y_test) = data
    steps_per_epoch = -(-len(x_train) // config.batch_size)
    total = args.epochs * steps_per_epoch
    warmup_steps = min(round(config.warmup_epochs * steps_per_epoch), total - 1)
    schedule = PolynomialDecayWithWarmup(
        config.peak_learning_rate,
        warmup_steps=warmup_steps,
        decay_steps=total - warmup_steps,
        end_learning_rate=0.0,
    )
    keras.utils.set_random_seed(seed)
    model = build_model(keras)
    reverted = {"authors": "", "pre": "abcde"}.get(config.variant, config.variant)
    with _nlcg_steps.timing(reverted):  # NLCG reads it when `fit` builds it
        optimizer = make_optimizer(config, schedule, args, steps_per_epoch)
        model.compile(
            optimizer,
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=False,
        )
        callbacks = [UseTrueWeights()] if config.recipe == "Neumann" else []
        start = time.perf_counter()
        history = model.fit(
            x_train,
            y_train,
            batch_size=config.batch_size,
            epochs=args.epochs,
            callbacks=callbacks,
            verbose=0,
        ).history
    seconds = time.perf_counter() - start
    _, accuracy = model.evaluate(x_test, y_test, batch_size=1000, verbose=0)
    loss = history["loss"][-1]
    return {
        "test_accuracy": 100 * float(accuracy),
        "final_loss": float(loss) if np.isfinite(loss) else float("nan"),
        "seconds": seconds,
    }


def configurations(args, train_size: int) -> list[Config]:
    configs = []
    for label in args.multipliers.split(","):
        if label == "extreme":
            batch = train_size // 2
        else:
            batch = BASE_BATCH * int(label)
        multiplier = batch / BASE_BATCH
        for recipe in RECIPES:
            if recipe == "LAMB + warmup":
                peak = args.lamb_learning_rate * math.sqrt(multiplier)
            elif recipe == "Neumann" and args.neumann_learning_rate is not None:
                peak = args.neumann_learning_rate * multiplier
            elif recipe.startswith("LARS") and getattr(
                args, "lars_learning_rate", None
            ):
                peak = args.lars_learning_rate * multiplier
            else:
                peak = args.base_learning_rate * multiplier
            warmup = 0.0 if recipe == "SGD" or multiplier == 1 else args.warmup_epochs
            variants = [None]
            if recipe == "NLCG" and getattr(args, "nlcg_variant", None):
                variants = args.nlcg_variant.split(",")
            for variant in variants:
                configs.append(Config(recipe, multiplier, batch, peak, warmup, variant))
    return configs


def summarize(configs, runs) -> list[dict]:
    baseline = next(c for c in configs if c.recipe == "SGD" and c.multiplier == 1)
    accuracies = {c.name: [r["test_accuracy"] for r in runs[c.name]] for c in configs}
    stats = harness.over_seeds(accuracies, baseline.name)
    rows = []
    for config in configs:
        s = stats[config.name]
        rows.append(
            {
                "recipe": config.label, "batch": config.batch_size,
                "multiplier": config.multiplier, "peak_lr": config.peak_learning_rate,
                "warmup_epochs": config.warmup_epochs, "mean": s["mean"],
                "std": s["std"], "diff": s["diff"], "ratio": s["ratio"],
                "seconds": statistics.mean(r["seconds"] for r in runs[config.name]),
                "accuracies": accuracies[config.name],
            }
        )  # fmt: skip
    return rows


def print_table(rows, seeds, evaluated_on: str = "test") -> None:
    accuracy = "val acc %" if evaluated_on == "validation" else "test acc %"
    header = (
        f"{'recipe':<14} {'batch':>5} {'peak lr':>8} {'warmup':>7} "
        f"{accuracy:>15} {'vs x1 SGD':>9} {'ratio':>6} {'s/run':>6}"
    )
    lines = []
    for row in rows:
        warmup = f"{row['warmup_epochs']:g} ep" if row["warmup_epochs"] else "-"
        lines.append(
            f"{row['recipe']:<14} {row['batch']:>5} {row['peak_lr']:>8.3g} "
            f"{warmup:>7} {row['mean']:>8.2f} ± {row['std']:<4.2f} "
            f"{row['diff']:>+9.2f} {row['ratio']:>6.3f} {row['seconds']:>6.1f}"
        )
    note = f"(mean ± std over {len(seeds)} seeds: {', '.join(map(str, seeds))})"
    harness.print_table(header, lines, note)


def plot(rows, path: Path, epochs: int, evaluated_on: str = "test") -> None:
    with harness.figure(path, size=(11, 4.5), dpi=120) as (_, (axis,)):
        _draw(rows, axis, epochs, evaluated_on)


def _draw(rows, axis, epochs: int, evaluated_on: str) -> None:
    import numpy as np

    batches = sorted({row["batch"] for row in rows})
    recipes = list(dict.fromkeys(row["recipe"] for row in rows))
    width = 0.8 / len(recipes)
    for i, recipe in enumerate(recipes):
        chosen = {r["batch"]: r for r in rows if r["recipe"] == recipe}
        means = [chosen[b]["mean"] if b in chosen else np.nan for b in batches]
        stds = [chosen[b]["std"] if b in chosen else 0.0 for b in batches]
        positions = np.arange(len(batches)) + (i - len(recipes) / 2 + 0.5) * width
        axis.bar(positions, means, width, yerr=stds, capsize=2, label=recipe)
    baseline = next(r for r in rows if r["recipe"] == "SGD" and r["multiplier"] == 1)
    axis.axhline(baseline["mean"], color="black", linestyle="--", linewidth=1)
    axis.set_xticks(np.arange(len(batches)), [f"batch {b}" for b in batches])
    axis.set_ylabel(f"{evaluated_on} accuracy % (mean ± std over seeds)")
    axis.set_ylim(0, 100)
    axis.legend(fontsize=8, ncol=3, loc="upper right")
    axis.set_title(f"mnist1d MLP, {epochs} epochs at every batch (dashed: x1 SGD)")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line's arguments (`argv`: a list, default `sys.argv[1:]`)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--multipliers", default="1,16,32,extreme")
    parser.add_argument("--num-samples", type=int, default=5000)
    parser.add_argument("--base-learning-rate", type=float, default=0.05)
    parser.add_argument("--lamb-learning-rate", type=float, default=0.002)
    parser.add_argument("--warmup-epochs", type=float, default=2)
    parser.add_argument("--eeta", type=float, default=0.05)
    parser.add_argument("--lars-weight-decay", type=float, default=1e-3)
    for flag, default, text in (
        ("--lars-learning-rate", None, "LARS' x1 rate, scaled linearly"),
        ("--neumann-reset-epochs", 10, "epochs before Neumann's first reset"),
        ("--neumann-beta", 1e-7, "repulsive term per parameter (paper: 1e-5, "
         "which diverges here)"),
        ("--neumann-learning-rate", None, "Neumann's x1 rate, scaled linearly"),
    ):  # fmt: skip
        parser.add_argument(flag, type=float, default=default, help=text)
    parser.add_argument(
        "--recipes",
        default=",".join(RECIPES),
        help="comma-separated subset of the recipes (x1 SGD always runs)",
    )
    parser.add_argument(
        "--nlcg-variant",
        help="comma-separated NLCG step-control timings, one row each: authors, "
        "pre, or the letters of the parts taken from before 1e9b5d4 (a, bd, ...)",
    )
    parser.add_argument(
        "--validation",
        action="store_true",
        help="train on the first 80%% of the training split and report accuracy on "
        "the last 20%% (for choosing hyperparameters); the test set is not used",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="PNG path; the JSON goes beside it (default: "
        "benchmarks/large_batch_optimizers.png; with --validation: none)",
    )
    args = parser.parse_args(argv)
    recipes = [r.strip() for r in args.recipes.split(",")]
    if not recipes or not set(recipes) <= set(RECIPES):
        parser.error(
            f"--recipes must be a comma-separated subset of {', '.join(RECIPES)}. "
            f"Received: --recipes={args.recipes}."
        )
    for label in args.multipliers.split(","):
        if label != "extreme" and not (label.isdigit() and int(label) >= 1):
            parser.error(
                "--multipliers must be a comma-separated list of integers >= 1 "
                f"or 'extreme'. Received: --multipliers={args.multipliers}."
            )
    if args.seeds < 1 or args.epochs < 1:
        parser.error(
            f"--seeds and --epochs must be >= 1. Received: --seeds={args.seeds}, "
            f"--epochs={args.epochs}."
        )
    return args


def measure(args):
    """Trains every configuration over the seeds: `(data, seeds, summary rows)`."""
    recipes = [r.strip() for r in args.recipes.split(",")]
    data = load_mnist1d(args.num_samples)
    if args.validation:
        data = split_validation(data, 0.2)
    size, x1 = len(data[0][0]), argparse.Namespace(**{**vars(args), "multipliers": "1"})
    baseline = configurations(x1, size)[0]  # x1 SGD, always run
    others = [c for c in configurations(args, size) if c.recipe in recipes]
    configs = [baseline] + [c for c in others if c != baseline]
    seeds = list(range(args.seeds))
    runs = {config.name: [] for config in configs}
    for seed in seeds:  # seed-major, so machine noise hits all configurations alike
        for config in configs:
            runs[config.name].append(train(config, seed, data, args))
    return data, seeds, summarize(configs, runs)


def main() -> None:
    args = parse_args()
    data, seeds, rows = measure(args)
    evaluated_on = "validation" if args.validation else "test"
    print(
        f"mnist1d: {len(data[0][0])} train / {len(data[1][0])} {evaluated_on} "
        f"examples, {args.epochs} epochs at every batch, one device, "
        f"LARS eeta={args.eeta:g}, weight decay {args.lars_weight_decay:g}"
    )
    print_table(rows, seeds, evaluated_on)
    output = args.output
    if output is None and not args.validation:
        output = HERE / "large_batch_optimizers.png"
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "evaluated_on": evaluated_on,
            "arguments": {k: str(v) for k, v in vars(args).items()},
            "seeds": seeds,
            "rows": rows,
        }
        harness.write_json(output.with_suffix(".json"), report)
        plot(rows, output, args.epochs, evaluated_on)
        print(f"plot: {output}, numbers: {output.with_suffix('.json')}")


if __name__ == "__main__":
    main()
