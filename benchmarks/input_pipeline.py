"""Does `kr.data.image_pipeline` keep training fed, and what does each optimization buy?

A real JPEG dataset is built offline in a temp dir: scikit-learn's digits upscaled
to `--size` pixels, tinted and noised (`kr.data.digit_images`), written as JPEG
(quality 90) in 16 TFRecord shards in the ImageNet schema. On it, in one process:

* delivered batches/s (`kr.data.measure_pipeline`, no model) of the full training
  pipeline and of an ablation that switches off one optimization at a time:
  parallel interleaved reads, cache, fused decode-and-crop, prefetch, parallel map
  (and all of them at once); interleave again without the cache (with the cache,
  files are read in the first epoch only); plus bfloat16 output;
* per-worker file sharding: the two pipelines of 2 input contexts (8 shards each),
  each alone, then both pulled at once by two threads (the aggregate);
* the tf.data service on loopback vs local: the same pipeline run by a dispatcher
  and 2 service workers (`kr.data.start_local_service`, real gRPC on 127.0.0.1,
  in this process and so on the same cores), in `distributed_epoch` mode (no
  cache, as that mode requires; compare with the local "no cache" arm) and in
  `parallel_epochs` mode (with the cache; compare with the full pipeline);
* the decode alone, one thread: ms per image for a random-resized-crop window,
  fused vs whole-image decode + slice, at 160 px and at ImageNet-like 448 px;
* delivered vs consumed: `fit` of `kr.models.small_resnet` on the full pipeline at
  the same image size and batch (one device, and 2 replicas of
  `kr.MultiDeviceReplicator` fed by `distribute_datasets_from_function`), its
  steady-state batches/s and `kr.callbacks.InputWait`'s input-wait share.

Every pipeline arm warms up for one epoch and more (so cached arms are timed on
the cache) and is timed over `--batches` batches; arms run interleaved, in rotating
order, for `--rounds` rounds; medians. Ratios are against the full pipeline of the
same run.

    python -m benchmarks.input_pipeline [--quick] [--rounds 3] [--size 160]

Prints the table; saves benchmarks/input_pipeline.png and .json.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness  # noqa: E402

HERE = pathlib.Path(__file__).parent
SHARDS = 16
FULL = "full pipeline"
# Arm name -> image_pipeline keyword arguments that differ from the full pipeline.
ABLATION = {
    FULL: {},
    "no interleave (1 file at a time)": {"num_parallel_reads": 1},
    "no cache": {"cache": False},
    "no cache, no interleave": {"cache": False, "num_parallel_reads": 1},
    "no fused crop (decode whole JPEG)": {"fused_crop": False},
    "no prefetch": {"prefetch": False},
    "no parallel map": {"num_parallel_calls": 1},
    "all five off": {
        "num_parallel_reads": 1,
        "cache": False,
        "fused_crop": False,
        "prefetch": False,
        "num_parallel_calls": 1,
    },
    "bfloat16 output": {"dtype": "bfloat16"},
}
# tf.data service arms (2 service workers on loopback) -> image_pipeline overrides.
SERVICE_ARMS = {
    "service distributed_epoch (no cache)": {
        "cache": False,
        "processing_mode": "distributed_epoch",
    },
    "service parallel_epochs (cache)": {"processing_mode": "parallel_epochs"},
}


# --------------------------------------------------------------------- pure helpers
summarize = harness.medians  # median over rounds of each arm's batches/s
rotate = harness.rotate  # the arms in the order of one round


def ratios(summary: dict[str, float], baseline: str = FULL) -> dict[str, float]:
    """Each arm's rate / the baseline's (same run)."""
    return harness.ratios(summary, baseline)


def table(summary: dict[str, float], batch_size: int, baseline: str = FULL) -> str:
    """A Markdown table: arm, batches/s, images/s, ratio to the baseline."""
    rows = [
        (arm, f"{summary[arm]:,.1f}", f"{summary[arm] * batch_size:,.0f}", f"{r:.2f}x")
        for arm, r in ratios(summary, baseline).items()
    ]
    return harness.markdown_table(
        ("arm", "batches/s", "images/s", f"/ {baseline}"), rows
    )


# --------------------------------------------------------------------- measurements
def build_dataset(directory, num_examples, size):
    from keras_replicator.data import digit_images, write_image_tfrecords

    images, labels = digit_images(num_examples, size)
    write_image_tfrecords(images, labels, directory, SHARDS, quality=90)
    total = sum(os.path.getsize(p) for p in pathlib.Path(directory).glob("*"))
    return os.path.join(directory, "*.tfrecord"), total


def pipeline(pattern, args, **overrides):
    from keras_replicator.data import image_pipeline

    options = dict(
        batch_size=args.batch, image_size=args.image_size, training=True, seed=0
    )
    options.update(overrides)
    return image_pipeline(pattern, **options)


def delivered(dataset, args, warmup):
    from keras_replicator.data import measure_pipeline

    return measure_pipeline(
        dataset, num_batches=args.batches, warmup=warmup
    ).batches_per_second


def sharded(pattern, args, warmup):
    """Per-pipeline rate alone, and the aggregate of both pulled at once."""
    import tensorflow as tf

    def make(i):
        context = tf.distribute.InputContext(2, i, 2)
        return pipeline(pattern, args, input_context=context)

    alone = [delivered(make(i), args, warmup // 2 + 2) for i in range(2)]
    results = [0.0, 0.0]

    def pull(i, dataset):
        results[i] = delivered(dataset, args, warmup // 2 + 2)

    threads = [threading.Thread(target=pull, args=(i, make(i))) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "pipeline 0 alone": alone[0],
        "pipeline 1 alone": alone[1],
        "both at once (sum)": sum(results),
    }


def served(pattern, args, warmup, address, round_index):
    """Delivered batches/s of each SERVICE_ARMS pipeline, read from `address`."""
    return {
        arm: delivered(
            pipeline(
                pattern,
                args,
                data_service=address,
                job_name=f"bench-{round_index}-{position}",
                **overrides,
            ),
            args,
            warmup,
        )
        for position, (arm, overrides) in enumerate(SERVICE_ARMS.items())
    }


class _Stamps:
    def __init__(self):
        import keras

        class Stamps(keras.callbacks.Callback):
            def __init__(inner):
                super().__init__()
                inner.times = []

            def on_train_batch_end(inner, batch, logs=None):
                inner.times.append(time.perf_counter())

        self.callback = Stamps()


def consumed(pattern, args, replicas):
    """Steady-state batches/s of `fit`-ting small_resnet, and its input-wait share."""
    import keras
    import tensorflow as tf

    import keras_replicator as kr

    wait = kr.callbacks.InputWait(every_n_steps=5, warmup_steps=3)
    stamps = _Stamps().callback
    if replicas == 1:
        strategy = tf.distribute.get_strategy()
        data = wait.watch(pipeline(pattern, args))
    else:
        strategy = kr.MultiDeviceReplicator(num_replicas=replicas)

        def input_fn(context):
            per_replica = context.get_per_replica_batch_size(args.batch)
            return wait.watch(
                pipeline(pattern, args, batch_size=per_replica, input_context=context)
            )

        data = strategy.distribute_datasets_from_function(input_fn)
    with strategy.scope():
        model = kr.models.small_resnet((args.image_size, args.image_size, 3), 10)
        model.compile(
            keras.optimizers.SGD(0.05, momentum=0.9),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(
        data,
        steps_per_epoch=args.fit_steps,
        epochs=1,
        verbose=0,
        callbacks=[wait, stamps],
    )
    steady = stamps.times[3:]
    rate = (len(steady) - 1) / (steady[-1] - steady[0])
    return rate, wait.shares[-1]


def decode_costs(sizes=(160, 448), images=32, repeats=20):
    """ms per image to decode a random-resized-crop window: fused vs whole + slice.

    One thread (`map_fn` in one `tf.function`), same JPEGs and windows for both.
    """
    import tensorflow as tf

    from keras_replicator.data import _crop, digit_images

    costs = {}
    for size in sizes:
        pixels, _ = digit_images(images, size)
        jpegs = tf.constant([tf.io.encode_jpeg(p, quality=90).numpy() for p in pixels])
        for fused in (True, False):

            @tf.function
            def run(jpegs, fused=fused):
                def one(args):
                    jpeg, k = args
                    shape = tf.io.extract_jpeg_shape(jpeg)[:2]
                    seed = tf.stack([tf.constant(0, tf.int64), k])
                    window = _crop.random_window(shape, seed)
                    image = _crop.decode_window(jpeg, window, fused=fused, channels=3)
                    return tf.reduce_sum(tf.cast(image, tf.int32))

                keys = tf.range(images, dtype=tf.int64)
                return tf.map_fn(one, (jpegs, keys), fn_output_signature=tf.int32)

            run(jpegs)
            start = time.perf_counter()
            for _ in range(repeats):
                run(jpegs)
            seconds = (time.perf_counter() - start) / (repeats * images)
            costs[f"{size} px, {'fused' if fused else 'whole + slice'}"] = 1e3 * seconds
    return costs


def plot(result, path):
    ablation = result["ablation_batches_per_s"]
    served = result.get("service_batches_per_s", {})
    fit = result["fit"]
    names = list(ablation) + list(served) + [f"fit consumes ({k})" for k in fit]
    values = (
        list(ablation.values())
        + list(served.values())
        + [v["consumed_batches_per_s"] for v in fit.values()]
    )
    colors = (
        ["tab:blue"]
        + ["tab:orange"] * (len(ablation) - 1)
        + ["tab:purple"] * len(served)
        + ["tab:green"] * len(fit)
    )
    size = (8, 0.45 * len(names) + 1.2)
    with harness.figure(path, size=size, dpi=110) as (_, (ax,)):
        ax.barh(names[::-1], values[::-1], color=colors[::-1])
        ax.set_xscale("log")
        batch, side = result["batch"], result["image_size"]
        ax.set_xlabel(f"batches/s (batch {batch}, {side} px)")
        ax.set_title("Input pipeline: delivered (ablation) vs consumed by fit")
        for y, value in enumerate(values[::-1]):
            ax.text(value, y, f" {value:,.1f}", va="center", fontsize=8)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small and fast")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=160, help="stored JPEG side")
    parser.add_argument("--image-size", type=int, default=64, help="output side")
    parser.add_argument("--examples", type=int, default=3072)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=200, help="timed per arm")
    parser.add_argument("--fit-steps", type=int, default=25)
    parser.add_argument("--out", default=None, help="path prefix of .json/.png")
    args = parser.parse_args(argv)
    if args.out is None:  # --quick results do not overwrite the committed ones
        folder = tempfile.gettempdir() if args.quick else HERE
        args.out = str(pathlib.Path(folder) / "input_pipeline")
    if args.quick:
        args.rounds, args.examples, args.batches, args.fit_steps = 1, 1024, 30, 10
        args.size, args.image_size = 64, 48

    import keras_replicator as kr

    kr.split_cpu(2)
    service = kr.data.start_local_service(num_workers=2)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        pattern, total_bytes = build_dataset(directory, args.examples, args.size)
        print(
            f"dataset: {args.examples} JPEGs {args.size}x{args.size}, {SHARDS} "
            f"shards, {total_bytes / 1e6:.1f} MB; batch {args.batch}, output "
            f"{args.image_size} px; {args.rounds} rounds x {args.batches} batches"
        )
        epoch = -(-args.examples // args.batch)
        runs: dict[str, list[float]] = {arm: [] for arm in ABLATION}
        shard_runs: dict[str, list[float]] = {}
        service_runs: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for arm in rotate(list(ABLATION), r):
                dataset = pipeline(pattern, args, **ABLATION[arm])
                runs[arm].append(delivered(dataset, args, epoch + 2))
                print(f"  round {r} {arm}: {runs[arm][-1]:,.1f} batches/s", flush=True)
            for name, rate in sharded(pattern, args, epoch + 2).items():
                shard_runs.setdefault(name, []).append(rate)
            for arm, rate in served(
                pattern, args, epoch + 2, service.address, r
            ).items():
                service_runs.setdefault(arm, []).append(rate)
                print(f"  round {r} {arm}: {rate:,.1f} batches/s", flush=True)
        summary = summarize(runs)
        shards = summarize(shard_runs)
        services = summarize(service_runs)
        fit = {}
        for replicas in (1, 2):
            rate, share = consumed(pattern, args, replicas)
            label = "1 device" if replicas == 1 else f"{replicas} replicas"
            fit[label] = {
                "consumed_batches_per_s": rate,
                "delivered_over_consumed": summary[FULL] / rate,
                "input_wait_share": share,
            }
    costs = decode_costs(repeats=5 if args.quick else 20)
    result = {
        "decode_ms_per_image": costs,
        "examples": args.examples,
        "stored_size": args.size,
        "image_size": args.image_size,
        "batch": args.batch,
        "rounds": args.rounds,
        "dataset_mb": total_bytes / 1e6,
        "ablation_batches_per_s": summary,
        "ablation_ratio": ratios(summary),
        "sharding_batches_per_s": shards,
        "service_batches_per_s": services,
        "fit": fit,
        "seconds": time.perf_counter() - start,
    }
    print("\n" + table(summary, args.batch))
    print("\nper-worker sharding (2 input contexts, 8 shards each):")
    for name, rate in shards.items():
        print(f"  {name}: {rate:,.1f} batches/s ({rate / summary[FULL]:.2f}x full)")
    print("\ntf.data service, 2 service workers on 127.0.0.1 (same 2 cores):")
    local_no_cache = summary["no cache"]
    for name, rate in services.items():
        base, label = (
            (local_no_cache, "local no cache")
            if "no cache" in name
            else (summary[FULL], "local full")
        )
        print(f"  {name}: {rate:,.1f} batches/s ({rate / base:.2f}x {label})")
    print("\ndecode of a random-resized-crop window, ms per image (1 thread):")
    for name, ms in costs.items():
        print(f"  {name}: {ms:.3f}")
    print("\ndelivered (full pipeline) vs consumed by fit of small_resnet:")
    for name, row in fit.items():
        print(
            f"  {name}: consumes {row['consumed_batches_per_s']:.2f} batches/s; "
            f"delivered / consumed = {row['delivered_over_consumed']:.1f}x "
            f"(target >= 3x); input wait share {row['input_wait_share']:.3f}"
        )
    harness.write_json(args.out + ".json", result, indent=2)
    plot(result, args.out + ".png")
    print(f"\nwrote {args.out}.json and {args.out}.png in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
