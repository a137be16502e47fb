"""`keras-replicator demo`: a small ResNet trained on N replicas, next to one device.

What a user should see in five minutes: `keras_replicator.auto()` picking the strategy
(here: logical CPU replicas), a ResNet with synchronized batch norm trained with LARS
and learning-rate warmup on scikit-learn's digits (written once as a local TFDS
dataset in 4 shards, read by `kr.data.image_pipeline` and upscaled to 16x16), a
progress bar, the test accuracy and
examples/s -- and the same training on one device from the same initial weights at the
same global batch. It writes a PNG of the curves and throughput and a JSON summary.
`--data` takes the user's own TFDS dataset or image folder instead.

Transparency, shown so that it holds up: in float32 the two runs drift apart (a split
batch sums in another order, and batch norm and LARS' trust ratios amplify those
rounding differences step after step: 5e-1 after 12 epochs, with the same accuracy
curves). So the demo also reruns the first epoch(s) in float64 on both sides, where
the weights agree to ~1e-14 after each batch (the input is an endless stream of full
global batches, an epoch being ceil(examples / batch) of them): the replicas
compute what one device computes, and the float32 gap is rounding. It reports that
gap step by step, the float32 gap after each epoch and the curves of both runs.

This module is the command (its flags, their checks and the order of the runs);
the training is in `_demo_training.py`, the float64 check in
`_demo_transparency.py`, the printed summary, JSON and PNG in `_demo_report.py`.
"""

from __future__ import annotations

import functools
import os

from keras_replicator.commands._demo_report import summarize, write
from keras_replicator.commands._demo_training import (
    EETA,
    batches,
    build_model,
    train_run,
)
from keras_replicator.commands._demo_transparency import float64_gaps


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "demo",
        help="train a small ResNet on bundled data, N replicas vs 1 device",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--replicas", type=int, default=2, help="default: %(default)s")
    parser.add_argument(
        "--batch-size", type=int, default=256, help="global batch (default: 256)"
    )
    parser.add_argument("--epochs", type=int, default=12, help="default: %(default)s")
    parser.add_argument(
        "--data",
        default="digits",
        help="'digits' (bundled), a TFDS name or prepared TFDS directory, or an "
        "image folder with one subfolder per class (default: digits)",
    )
    parser.add_argument("--data-dir", default=None, help="TFDS data directory")
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="resize images to this size (default: 16 for digits, else as stored)",
    )
    parser.add_argument(
        "--bn-group-size",
        type=int,
        default=None,
        help="replicas per batch-norm group (default: all replicas)",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=0.4,
        help="peak learning rate at batch 256, scaled linearly (default: 0.4)",
    )
    parser.add_argument(
        "--warmup-epochs", type=float, default=2.0, help="default: %(default)s"
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the one-device run"
    )
    parser.add_argument(
        "--check-epochs",
        type=int,
        default=1,
        help="first epochs rerun in float64 on the replicas and on one device, to "
        "show their weights agree up to rounding; 0 skips (default: %(default)s)",
    )
    parser.add_argument(
        "--output-dir", default="demo_output", help="for demo.png and summary.json"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(command=run)
    return parser


def _check(args):
    for name in ("replicas", "batch_size", "epochs"):
        value = getattr(args, name)
        if value < 1:
            raise SystemExit(
                f"keras-replicator demo: --{name.replace('_', '-')} must be a "
                f"positive integer. Received: {name}={value}."
            )
    if not 0 <= args.check_epochs <= args.epochs:
        raise SystemExit(
            "keras-replicator demo: --check-epochs must be between 0 and --epochs. "
            f"Received: check_epochs={args.check_epochs}, epochs={args.epochs}."
        )
    if args.batch_size < args.replicas:
        raise SystemExit(
            "keras-replicator demo: --batch-size is the global batch and must be at "
            f"least --replicas. Received: batch_size={args.batch_size}, "
            f"replicas={args.replicas}."
        )


def run(args) -> int:
    _check(args)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras_replicator as kr

    strategy = kr.auto(num_replicas=args.replicas)
    import keras
    import tensorflow as tf

    from keras_replicator.data import load_image_classification

    image_size = args.image_size or (16 if args.data == "digits" else None)
    data = load_image_classification(
        args.data, data_dir=args.data_dir, image_size=image_size
    )
    print(
        f"data: {data.description}: {data.train_size} train / {data.test_size} test "
        f"images of {data.image_shape}, {data.num_classes} classes"
    )
    steps_per_epoch = -(-data.train_size // args.batch_size)
    peak = kr.scaled_learning_rate(args.learning_rate, args.batch_size)
    setup = {
        "model": "ResNet-8 (small_resnet), SyncBatchNormalization",
        "optimizer": f"LARS (eeta {EETA}, momentum 0.9, weight decay 5e-4)",
        "schedule": f"linear warmup {args.warmup_epochs} epochs to {peak:.3g}, "
        "then polynomial decay (power 2) to 0",
        "global_batch_size": args.batch_size,
        "epochs": args.epochs,
        "bn_group_size": args.bn_group_size,
    }
    for key, value in setup.items():
        print(f"{key}: {value}")

    build = functools.partial(build_model, data, args, peak, steps_per_epoch)
    train = functools.partial(batches, data, args, True)
    test = functools.partial(batches, data, args, False)

    keras.utils.set_random_seed(args.seed)
    initial = build().get_weights()
    runs = [(f"{strategy.num_replicas_in_sync} replicas", strategy)]
    if not args.no_baseline:
        runs.append(("1 device", tf.distribute.get_strategy()))
    results = {}
    for label, current in runs:
        results[label] = train_run(
            label, current, build, initial, train, test, args, steps_per_epoch
        )
    gaps = None
    if len(runs) == 2 and args.check_epochs:
        print(f"\n== float64: the first {args.check_epochs} epoch(s) again ==")
        gaps = float64_gaps(
            runs,
            build,
            initial,
            functools.partial(train, "float64"),
            args,
            steps_per_epoch,
        )
    summary = summarize(results, setup, data, gaps, steps_per_epoch)
    if kr.is_chief():
        write(summary, results, args.output_dir)
    return 0
