"""`GPipe`: a Keras model that runs a chain of layers as a pipeline over devices."""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_replicator import _platform
from keras_replicator._arguments import check_int
from keras_replicator.pipeline import _microbatch, _partition, _placement, _schedule
from keras_replicator.pipeline._checkpoint import BackwardChain, checkpointed
from keras_replicator.pipeline._stage import Stage

CHECKPOINT_MODES = ("always", "except_last", "never")


@keras.saving.register_keras_serializable(package="keras_replicator")
class GPipe(keras.Model):
    """Pipeline parallelism: a chain of layers cut into stages on several devices.

    GPipe cuts a sequence of layers into K stages, places stage k on device k and
    splits every mini-batch into M micro-batches. In the compiled step, stage k
    works on micro-batch i while stage k + 1 works on micro-batch i - 1 (the
    fill-drain schedule, `M + K - 1` clocks instead of `M * K`), and each stage
    stores only its input per micro-batch, recomputing its activations during
    back-propagation (re-materialization). The loss is computed on the whole
    mini-batch and gradients are accumulated over micro-batches, so one update is
    made per mini-batch with the same gradient as one device.

    `GPipe` is a `keras.Model`: `compile`, `fit`, `evaluate`, `predict`,
    callbacks, `save("m.keras")` and `keras.models.load_model` work, and it can be
    built in a Replicator's scope for pipeline x data parallelism (each replica
    runs the whole pipeline on its local devices; gradients are all-reduced once
    per mini-batch). With several replicas on a worker's GPUs each replica runs
    its stages on GPUs of its own: its own GPU, then its share of the GPUs that
    are no replica's (see `keras_replicator/pipeline/_placement.py`). It uses the
    given layers themselves: the wrapped model and the pipeline share weights.
    `get_weights` / `set_weights` follow the wrapped model's order, so weights
    move between the plain model and its pipeline.

    Batch norm: each micro-batch is normalized with its own statistics, and the
    moving statistics move once per mini-batch with the whole mini-batch's
    statistics (deferred batch norm, see `keras_replicator/pipeline/_batchnorm.py`):
    with `num_microbatches=1` training equals one device exactly.

    Args:
        model_or_layers: a `keras.Sequential`, a functional model whose layers form
            a single chain (no skip connections between top-level layers; wrap
            residual blocks as layers), or a list of layers.
        balance: layers per stage over the chain (`InputLayer` excluded), e.g.
            `[3, 2]`; or None to split the layers evenly over `devices`. See
            `balance_by_size` and `balance_by_time`. Defaults to `None`.
        num_microbatches: M, the number of micro-batches per mini-batch. A batch
            size not divisible by M is split unevenly (the first micro-batches get
            one sample more); the result is the same. Defaults to `1`.
        checkpoint: re-materialization: `"always"`, `"except_last"` (all but the
            last micro-batch, whose backward pass follows its forward pass at
            once) or `"never"`. Defaults to `"except_last"`.
        devices: one device name per stage (`"/gpu:0"`, `"/cpu:1"`), or None for
            the local GPUs, else the local logical CPU devices
            (`keras_replicator.split_cpu(n)` at start-up makes them). Defaults to
            `None`.
        **kwargs: `keras.Model` arguments such as `name`.

    Raises:
        ValueError: for a `balance` that does not sum to the number of layers,
            more stages than devices (per replica, with several replicas on a
            worker's GPUs), an unknown `checkpoint`, a non-positive
            `num_microbatches`, or a model with branches that cannot be cut.

    Example:
    >>> import keras, numpy as np, keras_replicator as kr
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
    ...                           keras.layers.Dense(1)])
    >>> pipe = kr.pipeline.GPipe(model, balance=[1, 1], num_microbatches=2)
    >>> pipe.compile(optimizer="sgd", loss="mse")
    >>> pipe.predict(np.ones((4, 4)), verbose=0).shape
    (4, 1)

    References:
        Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks
        using Pipeline Parallelism", https://arxiv.org/abs/1811.06965.
    """

    def __init__(
        self,
        model_or_layers,
        balance=None,
        num_microbatches: int = 1,
        checkpoint: str = "except_last",
        devices=None,
        **kwargs,
    ):
        layers = _partition.chain_of_layers(model_or_layers)
        check_int("num_microbatches", num_microbatches)
        if checkpoint not in CHECKPOINT_MODES:
            raise ValueError(
                f"`checkpoint` must be one of {CHECKPOINT_MODES}. "
                f"Received: checkpoint={checkpoint!r}."
            )
        available = _local_devices() if devices is None else list(devices)
        groups = _device_groups(available)
        if balance is None:
            balance = _partition.even_balance(len(layers), min(len(g) for g in groups))
        balance = _partition.check_balance(balance, len(layers))
        _check_devices_per_replica(len(balance), available)
        if len(balance) > len(available):
            raise ValueError(
                f"`balance` asks for {len(balance)} stages but there are only "
                f"{len(available)} devices. Received: balance={balance!r}, "
                f"devices={available!r}. Pass at most {len(available)} stages, or "
                "more devices (e.g. `keras_replicator.split_cpu(n)` at start-up)."
            )
        super().__init__(**kwargs)
        self.chain = layers
        self.balance = balance
        self.num_microbatches = num_microbatches
        self.checkpoint = checkpoint
        # The first local replica's stage devices (all of them: one replica).
        self.devices = groups[0][: len(balance)]
        self._available = available
        self._devices_argument = None if devices is None else list(devices)
        self._stages = [Stage(x) for x in _partition.split(layers, balance)]
        self._built_input_shape = None
        input_shape = _known_input_shape(model_or_layers)
        if input_shape is not None:
            self.build(input_shape)

    @property
    def stages(self) -> list[list]:
        """The layers of each stage."""
        return [stage.layers for stage in self._stages]

    def build(self, input_shape):
        spec = keras.KerasTensor(input_shape, dtype=self.input_dtype)
        for layer in self.chain:
            spec = layer(spec) if not layer.built else layer.compute_output_spec(spec)
        self._built_input_shape = tuple(input_shape)

    def call(self, inputs, training=None):
        training = bool(training)
        microbatches = _microbatch.split(inputs, self.num_microbatches)
        outputs = list(microbatches)
        values = [None] * len(self._stages)
        bn_stats = [[] for _ in self._stages]
        chains = [BackwardChain() for _ in self._stages]
        devices = self._replica_stage_devices()
        for clock in _schedule.clock_cycles(len(microbatches), len(self._stages)):
            for i, k in clock:
                stage = self._stages[k]
                if values[k] is None:
                    values[k] = stage.read(devices[k])
                weights, state = values[k]
                with tf.device(devices[k]):
                    if training and self._checkpoints(i, len(microbatches)):
                        y, (state, stats) = checkpointed(
                            lambda x, w, s=state, st=stage: st.run(x, w, s, True),
                            outputs[i],
                            weights,
                            devices[k],
                            chains[k],
                        )
                    else:
                        y, (state, stats) = stage.run(
                            outputs[i], weights, state, training
                        )
                outputs[i] = y
                values[k] = (weights, state)
                bn_stats[k].append(stats)
        if training:
            for k, (stage, (_, state), stats) in enumerate(
                zip(self._stages, values, bn_stats)
            ):
                stage.commit(devices[k], state, stats)
        return _microbatch.join(outputs)

    def _replica_stage_devices(self) -> list[str]:
        """The stage devices of the replica whose step is being built."""
        groups = _device_groups(self._available)
        _check_devices_per_replica(len(self._stages), self._available)
        group = groups[_placement.local_replica(len(groups))]
        return group[: len(self._stages)]

    def _checkpoints(self, microbatch: int, num_microbatches: int) -> bool:
        if self.checkpoint == "always":
            return True
        if self.checkpoint == "except_last":
            return microbatch < num_microbatches - 1
        return False

    def compute_output_spec(self, inputs, training=None):
        spec = inputs
        for layer in self.chain:
            spec = layer.compute_output_spec(spec)
        return spec

    def get_build_config(self):
        return {"input_shape": self._built_input_shape}

    def build_from_config(self, config):
        if config.get("input_shape") is not None:
            self.build(tuple(config["input_shape"]))

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "layers": [keras.saving.serialize_keras_object(x) for x in self.chain],
            "balance": list(self.balance),
            "num_microbatches": self.num_microbatches,
            "checkpoint": self.checkpoint,
            "devices": self._devices_argument,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        layers = [
            keras.saving.deserialize_keras_object(x, custom_objects=custom_objects)
            for x in config.pop("layers")
        ]
        return cls(layers, **config)


def _known_input_shape(model_or_layers):
    if isinstance(model_or_layers, keras.Model):
        try:
            shape = model_or_layers.input_shape
        except (AttributeError, ValueError):
            return None
        if isinstance(shape, tuple) and all(
            d is None or isinstance(d, int) for d in shape
        ):
            return shape
    return None


def _device_groups(available) -> list[list[str]]:
    # The strategy in scope (in a replica context: the one running the step).
    strategy = tf.distribute.get_strategy()
    return _placement.device_groups(
        available,
        _placement.replica_devices(strategy),
        _platform.platform_of(strategy),
    )


def _check_devices_per_replica(num_stages: int, available) -> None:
    strategy = tf.distribute.get_strategy()
    replicas = _placement.replica_devices(strategy)
    if not _placement.shares_out(replicas, _platform.platform_of(strategy)):
        return
    if num_stages > min(len(g) for g in _device_groups(available)):
        raise _placement.too_few_devices_error(num_stages, replicas, available)


def _local_devices() -> list[str]:
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [f"/gpu:{i}" for i in range(len(gpus))]
    return [f"/cpu:{i}" for i in range(len(tf.config.list_logical_devices("CPU")))]
