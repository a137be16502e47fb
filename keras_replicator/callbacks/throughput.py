"""`Throughput`: global and per-replica examples/s, step time, and stragglers.

In synchronous training every worker waits for the slowest at each all-reduce, so
wall-clock step time is the same everywhere and cannot name a straggler. What does
differ is the time a worker spends *outside* the compiled step (its callbacks, Python
input code, logging): a worker slow there makes all others wait inside their step.
The callback times every call of `model.train_function` (it wraps it for the
duration of `fit`), so outside-step time is wall time minus time inside the step.
Every `every_n_steps` batches the callback all-gathers each worker's outside-step
time (one small collective) and warns, naming the worker, when the slowest exceeds
`straggler_ratio` times the median.
"""

from __future__ import annotations

import statistics
import time
import warnings

import keras
import tensorflow as tf

from keras_replicator import _roles, replica
from keras_replicator.keras_integration import _sample_counter


class Throughput(keras.callbacks.Callback):
    """Logs examples/s (global and per replica), step time and worker balance.

    Adds to the batch logs every `every_n_steps` batches: `examples_per_second`,
    `examples_per_second_per_replica`, `step_seconds`, and on several workers
    `host_seconds_spread` (slowest worker's time outside the step / median). The
    epoch logs get the epoch's average `examples_per_second`.

    Under keras_replicator strategies the examples are counted exactly inside the
    step (a short last batch counts what it holds), in the fits this callback
    is given to (a train function an earlier `fit` built without counting is
    built again). Elsewhere (one device, stock strategies) pass `batch_size`:
    each batch then counts as that many examples.

    Args:
        every_n_steps: Measure every this many batches. Defaults to `50`.
        straggler_ratio: Warn when a worker's time outside the step is this many
            times the median (and at least 10 ms above it). Defaults to `1.5`.
        batch_size: The global batch size, used to count examples when the model
            is not under a keras_replicator strategy. Defaults to `None`.

    Example:
    >>> import keras_replicator as kr
    >>> callback = kr.callbacks.Throughput(every_n_steps=50)
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        straggler_ratio: float = 1.5,
        batch_size: int | None = None,
    ):
        super().__init__()
        if batch_size is not None and (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, int)
            or batch_size < 1
        ):
            raise ValueError(
                "`batch_size` must be a positive integer or None. "
                f"Received: batch_size={batch_size!r}."
            )
        if (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 1
        ):
            raise ValueError(
                "`every_n_steps` must be a positive integer. "
                f"Received: every_n_steps={every_n_steps!r}."
            )
        if not straggler_ratio > 1:
            raise ValueError(
                "`straggler_ratio` must be greater than 1. "
                f"Received: straggler_ratio={straggler_ratio!r}."
            )
        self.every_n_steps = every_n_steps
        self.straggler_ratio = straggler_ratio
        self.batch_size = batch_size
        self.stragglers: list[int] = []
        self._gather = None

    def set_model(self, model):
        from keras_replicator import _compat

        super().set_model(model)
        # Before `fit` builds its train function (on every worker, also under
        # `ChiefOnly`): it counts samples from now on.
        _sample_counter.request(model)
        built = getattr(model, "train_function", None) is not None
        if built and not _sample_counter.counting(model):
            if _compat.is_replicator(model.distribute_strategy):
                model.train_function = None  # `fit` builds it again, counting

    def on_train_begin(self, logs=None):
        from keras_replicator import _compat

        counted = _compat.is_replicator(self.model.distribute_strategy)
        if not counted and self.batch_size is None:
            raise ValueError(
                "`Throughput` counts examples inside the step only under keras_"
                "replicator strategies. Received: a model under "
                f"{type(self.model.distribute_strategy).__name__} and "
                "batch_size=None. Pass `batch_size` (the global batch) or build "
                "the model under `kr.auto()`."
            )
        self._counted = counted
        self._batches = self._epoch_first_batch = 0
        self._inside_seconds = 0.0
        self._unwrapped = self.model.train_function

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return self._unwrapped(*args, **kwargs)
            finally:
                self._inside_seconds += time.perf_counter() - start

        self.model.train_function = timed

    def on_train_end(self, logs=None):
        self.model.train_function = self._unwrapped

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_first_batch = self._batches
        self._epoch_start = time.perf_counter()
        self._epoch_samples = self._samples()
        self._window_start = self._epoch_start
        self._window_samples = self._epoch_samples
        self._window_inside = self._inside_seconds

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the epoch's last step so far (several per call with
        # `steps_per_execution`).
        self._batches = self._epoch_first_batch + batch + 1
        if (batch + 1) % self.every_n_steps == 0:
            now = time.perf_counter()
            samples = self._samples()
            seconds = now - self._window_start
            rate = (samples - self._window_samples) / seconds if seconds > 0 else 0.0
            replicas = self.model.distribute_strategy.num_replicas_in_sync
            if logs is not None:
                logs["examples_per_second"] = rate
                logs["examples_per_second_per_replica"] = rate / replicas
                logs["step_seconds"] = seconds / self.every_n_steps
                inside = self._inside_seconds - self._window_inside
                spread = self._check_balance(seconds - inside)
                if spread is not None:
                    logs["host_seconds_spread"] = spread
            self._window_start, self._window_samples = time.perf_counter(), samples
            self._window_inside = self._inside_seconds

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._epoch_start
        samples = self._samples() - self._epoch_samples
        if logs is not None and seconds > 0:
            logs["examples_per_second"] = samples / seconds

    def _samples(self) -> float:
        if not self._counted:
            return float(self._batches * self.batch_size)
        seen = _sample_counter.samples_seen(self.model)
        return 0.0 if seen is None else seen

    def _check_balance(self, host_seconds):
        strategy = self.model.distribute_strategy
        workers = getattr(strategy, "num_workers", 1)
        if workers < 2 or _roles.mesh_spans_workers(strategy):
            return None  # a mesh has no replica per worker to gather over
        if self._gather is None:
            self._gather = _gather_per_replica(strategy)
        per_replica = self._gather(host_seconds).tolist()
        per_worker = per_replica[:: len(per_replica) // workers]
        median = statistics.median(per_worker)
        slowest = max(range(workers), key=per_worker.__getitem__)
        spread = per_worker[slowest] / median if median > 0 else 1.0
        if spread > self.straggler_ratio and per_worker[slowest] - median > 0.01:
            self.stragglers.append(slowest)
            if _roles.is_chief(strategy):
                warnings.warn(
                    f"Worker {slowest} is a straggler: {per_worker[slowest]:.3f} s "
                    f"outside the training step over the last {self.every_n_steps} "
                    f"batches, {spread:.1f}x the median {median:.3f} s. Every other "
                    "worker waits for it at each all-reduce: check its input "
                    "pipeline, callbacks and host load.",
                    stacklevel=2,
                )
        return spread

    def get_config(self):
        return {
            "every_n_steps": self.every_n_steps,
            "straggler_ratio": self.straggler_ratio,
            "batch_size": self.batch_size,
        }


def _gather_per_replica(strategy):
    @tf.function
    def gather(value):
        def replica_fn():
            return replica.all_gather(tf.reshape(value, [1]))

        return strategy.experimental_local_results(strategy.run(replica_fn))[0]

    return lambda seconds: gather(tf.constant(seconds, tf.float64)).numpy()
