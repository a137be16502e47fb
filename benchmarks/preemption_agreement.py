"""What does the preemption agreement of `BackupAndRestore` cost per step on 2 workers?

    python -m benchmarks.preemption_agreement [--rounds 5] [--steps 60]
        [--transport socket|collective]

Starts 2 worker processes on 127.0.0.1 (`keras_replicator.launch.run_workers`), each
with a `MultiWorkerReplicator`, and has them train a small MLP in many short `fit`
calls that take turns between three arms: `BackupAndRestore(preemption_signals=None)`
(no agreement: the baseline), `BackupAndRestore()` (listening for SIGTERM, so the
workers agree on a step to stop after) and the baseline again (the A/A noise floor).
`save_freq=False`: no backup is written, only the agreement is timed. Each `fit` is
timed between consecutive `on_train_batch_end` calls after its first two steps; the
median over all rounds of an arm is its ms/step, so one descheduled step does not
decide. The arms run in the same processes, interleaved, so they see the same machine.
The time spent inside the callback's `on_train_batch_end` is also timed: the
agreement's own cost, without the step's noise (the eager all-reduce waited there).

Printed: ms/step and ms in the callback of each arm on worker 0, and the agreement's
cost (with − without, in ms and as a ratio). Issue 48, item 14: the agreement
used to be an eager 4-byte all-reduce and a `.numpy()` after every batch; it now
rides the step's log all-reduce (`keras_replicator/_worker/preemption.py`). To compare
with an older checkout, run this script with `PYTHONPATH` pointing at it (the
workers inherit the environment).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

from benchmarks import harness

ARMS = ("without", "with", "without, again")

_WORKER = textwrap.dedent(
    """
    import json, os, statistics, sys, time
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras, numpy as np
    import keras_replicator as kr

    rounds, steps, transport = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    arms = json.loads(sys.argv[4])
    strategy = kr.MultiWorkerReplicator(
        all_reduce=kr.AllReduceOptions(transport=transport))
    rng = np.random.default_rng(0)
    batch = 64
    x = rng.normal(size=(batch * steps, 128)).astype("float32")
    y = rng.integers(0, 10, size=(batch * steps,))
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((128,)),
            keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(True))

    class Intervals(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.stamps = []
        def on_train_batch_end(self, batch, logs=None):
            self.stamps.append(time.perf_counter())

    def run(arm):
        signals = None if arm.startswith("without") else ("SIGTERM",)
        backup = kr.callbacks.BackupAndRestore(
            "/tmp/kr-bench-preemption-unused", save_freq=False,
            preemption_signals=signals, exit_on_preemption=False)
        intervals, spent = Intervals(), []
        inner = backup.on_train_batch_end

        def timed(batch, logs=None):  # the callback's own time after a batch
            start = time.perf_counter()
            inner(batch, logs)
            spent.append(time.perf_counter() - start)

        backup.on_train_batch_end = timed
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
                  callbacks=[backup, intervals])
        stamps = intervals.stamps[2:]
        return [b - a for a, b in zip(stamps, stamps[1:])], spent[2:]

    for arm in arms:  # warm-up: every variant of the step traced
        run(arm)
    times = {arm: [] for arm in arms}
    spent = {arm: [] for arm in arms}
    for _ in range(rounds):
        for arm in arms:
            step_times, callback_times = run(arm)
            times[arm] += step_times
            spent[arm] += callback_times
    print("TIMES " + json.dumps({"step": times, "callback": spent}), flush=True)
    """
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60, help="steps per fit")
    parser.add_argument("--transport", default="socket")
    args = parser.parse_args(argv)

    from keras_replicator.launch import run_workers

    command = [
        sys.executable,
        "-c",
        _WORKER,
        str(args.rounds),
        str(args.steps),
        args.transport,
        json.dumps(ARMS),
    ]
    result = run_workers(command, 2, timeout=1200, echo=False)
    if not result.ok:
        raise SystemExit("\n".join(w.output[-3000:] for w in result.workers))
    measured = harness.read_result(result.workers[0].output, "worker 0", "TIMES ")
    times, spent = measured["step"], measured["callback"]
    median = {arm: 1e3 * m for arm, m in harness.medians(times).items()}
    spent_median = harness.medians(spent)
    print(
        f"2 workers, transport={args.transport}, {args.rounds} rounds x "
        f"{args.steps} steps, median ms (worker 0): step interval | time in "
        "BackupAndRestore.on_train_batch_end"
    )
    for arm in ARMS:
        callback = 1e3 * spent_median[arm]
        print(
            f"  {arm:<16} {median[arm]:8.3f} | {callback:7.3f}  "
            f"({len(times[arm])} steps)"
        )
    base = (median["without"] + median["without, again"]) / 2
    print(
        f"agreement cost: {median['with'] - base:+.3f} ms/step; "
        f"with/without = {median['with'] / base:.3f}; "
        f"A/A = {median['without, again'] / median['without']:.3f}"
    )


if __name__ == "__main__":
    main()
