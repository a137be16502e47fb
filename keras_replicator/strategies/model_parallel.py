"""`ModelParallelReplicator`: a Keras `LayoutMap` on a device mesh (issue 52)."""

from __future__ import annotations

import contextlib
import warnings
import weakref

import keras
import tensorflow as tf
from tensorflow.experimental import dtensor

from keras_replicator import _compat
from keras_replicator.keras_integration import _hooks
from keras_replicator.layouts._batches import MeshBatches
from keras_replicator.layouts._known_errors import rows_split_after_concatenation
from keras_replicator.layouts._mesh import backend_mesh
from keras_replicator.layouts._plan import LayoutPlan
from keras_replicator.layouts._step import mesh_step
from keras_replicator.layouts._variables import (
    LaidOutVariable,
    gathered,
    make_variable,
)


class ModelParallelReplicator(tf.distribute.OneDeviceStrategy):
    """Tensor and data parallelism from a Keras `LayoutMap`, on TensorFlow.

    Takes the `LayoutMap` that Keras or keras-hub gives (e.g.
    `keras_hub.models.GemmaBackbone.get_layout_map(mesh)`), unchanged. Every
    variable made in `scope()` is split over the map's `DeviceMesh` as its entry
    says (TensorFlow's DTensor stores, on each device, only its shard), the
    optimizer's slots like their weights; each batch is split over the
    `batch_dim_name` axis; and DTensor expands each training step into the
    per-device program with the collectives the layouts imply. Numbers are one
    device's: a layout changes where values live, never what they are.

    To TensorFlow and Keras this is one replica (`num_replicas_in_sync == 1`): the
    mesh runs one global program, so Keras' loss and metrics need no cross-replica
    step. The mesh may span worker processes: in each worker of a
    multi-worker run (`keras-replicator launch`), `kr.devices(n)` joins the
    workers and names every worker's devices (docs/layouts.md, "Several
    workers"). Not supported yet: `distribute_datasets_from_function` and
    sparse or ragged inputs (docs/layouts.md).

    Args:
        layout_map: A `keras.distribution.LayoutMap` whose `device_mesh` holds
            local devices (`kr.devices(n)`).
        batch_dim_name: The mesh axis the batch is split over. Defaults to
            `None`: the mesh's first axis, as `keras.distribution.ModelParallel`.
        fully_shard: Whether every variable the map leaves whole is split over
            the batch axis too, along its last dimension the axis divides
            (fully sharded data parallelism, ZeRO-3 / FSDP): each device keeps
            about 1/N of every weight and optimizer slot, and DTensor gathers a
            weight where a step uses it. With an empty `LayoutMap` on a
            one-axis mesh this is plain FSDP. Defaults to `False`.

    Raises:
        TypeError: `layout_map` is not a `keras.distribution.LayoutMap`.
        ValueError: An entry names an axis the mesh lacks, `batch_dim_name` is
            not an axis, or a device is not local.

    Example:
    >>> import keras, keras_replicator as kr
    >>> axes = ["batch", "model"]
    >>> mesh = keras.distribution.DeviceMesh((1, 2), axes, kr.devices(2))
    >>> layout_map = keras.distribution.LayoutMap(mesh)
    >>> layout_map[".*/dense/kernel"] = (None, "model")  # Keys match `variable.path`.
    >>> strategy = kr.ModelParallelReplicator(layout_map)
    >>> with strategy.scope():
    ...     layers = [keras.Input((4,)), keras.layers.Dense(6, name="dense")]
    ...     model = keras.Sequential(layers)
    >>> strategy.layout_of(model.weights[0]).sharding_specs
    ['unsharded', 'model']
    """

    def __init__(self, layout_map, *, batch_dim_name=None, fully_shard=False):
        _hooks.install()  # Keras' saving on several workers (`worker_index`)
        if not isinstance(layout_map, keras.distribution.LayoutMap):
            raise TypeError(
                "`layout_map` must be a `keras.distribution.LayoutMap`. Received: "
                f"layout_map={layout_map!r} of type {type(layout_map).__name__}. "
                "Build one on a `keras.distribution.DeviceMesh`, or take a "
                "keras-hub backbone's `get_layout_map(mesh)`."
            )
        _compat.apply_dtensor_settings()
        device_mesh = layout_map.device_mesh
        mesh = backend_mesh(device_mesh)
        if batch_dim_name is None:
            batch_dim_name = device_mesh.axis_names[0]
        if batch_dim_name not in mesh.dim_names:
            raise ValueError(
                "`batch_dim_name` must be an axis of the mesh. Received: "
                f"batch_dim_name={batch_dim_name!r} with mesh axes "
                f"{list(mesh.dim_names)}."
            )
        self._mesh = mesh
        self._batch_dim_name = batch_dim_name
        self._checked_models: weakref.WeakSet = weakref.WeakSet()
        if not isinstance(fully_shard, bool):
            raise TypeError(
                "`fully_shard` must be True or False. Received: "
                f"fully_shard={fully_shard!r}."
            )
        self._plan = LayoutPlan(
            layout_map, mesh, batch_dim_name if fully_shard else None
        )
        super().__init__(mesh.local_devices()[0])

    @property
    def mesh(self) -> dtensor.Mesh:
        """The DTensor mesh of the layout map's `DeviceMesh`."""
        return self._mesh

    @property
    def batch_dim_name(self) -> str:
        return self._batch_dim_name

    @property
    def worker_index(self) -> int:
        """This worker's index: its DTensor client id (0 in one process).

        Worker 0 is the chief: when every worker saves (`model.save`,
        `save_weights`, Keras' `ModelCheckpoint` and `BackupAndRestore`, as a
        save reads every weight whole from all workers), the chief's file is
        published atomically and the others' go to scratch, as under
        `MultiWorkerReplicator` (docs/layouts.md, "Several workers").
        """
        return dtensor.client_id()

    @property
    def num_workers(self) -> int:
        """Worker processes the mesh spans: DTensor's clients (1 in one process)."""
        return dtensor.num_clients()

    def layout_of(self, variable) -> dtensor.Layout:
        """The DTensor layout a Keras (or TF) variable made in `scope()` has."""
        value = getattr(variable, "value", variable)
        if isinstance(value, dtensor.DVariable):
            return value.layout
        return dtensor.fetch_layout(value)

    def bytes_per_device(self, variables) -> list[int]:
        """Bytes each local mesh device stores for `variables`, from their shards.

        With several workers, this worker's devices only.

        Example:
        >>> import keras, keras_replicator as kr
        >>> axes = ["batch", "model"]
        >>> mesh = keras.distribution.DeviceMesh((1, 2), axes, kr.devices(2))
        >>> layout_map = keras.distribution.LayoutMap(mesh)
        >>> layout_map[".*/kernel"] = (None, "model")
        >>> strategy = kr.ModelParallelReplicator(layout_map)
        >>> with strategy.scope():
        ...     dense = keras.layers.Dense(4, use_bias=False, dtype="float32")
        ...     dense.build((None, 8))
        >>> strategy.bytes_per_device(dense.weights)  # 8 x 4 floats, half each
        [64, 64]
        """
        totals = [0] * len(self._mesh.local_devices())
        for variable in variables:
            value = getattr(variable, "value", variable)
            if isinstance(value, LaidOutVariable):
                shards = value.shards()
            else:
                shards = dtensor.unpack(tf.convert_to_tensor(value))
            for index, shard in enumerate(shards):
                totals[index] += shard.shape.num_elements() * shard.dtype.size
        return totals

    @contextlib.contextmanager
    def scope(self):
        """The strategy's scope: variables made in it are laid out on the mesh."""
        # The strategy's own creator runs first (innermost) and hands ours the
        # `distribute_strategy` that marks a variable as made in this scope.
        with tf.variable_creator_scope(self._create_on_mesh):
            with super().scope(), dtensor.default_mesh(self._mesh):
                yield self

    def _create_on_mesh(self, next_creator, **kwargs):
        path = _compat.keras_variable_path(kwargs.get("name") or "Variable")
        value = kwargs.get("initial_value")
        with tf.init_scope():
            value = tf.convert_to_tensor(
                value() if callable(value) else value, dtype=kwargs.get("dtype")
            )
        return make_variable(value, kwargs, self._plan.layout_for(path, value.shape))

    def experimental_distribute_dataset(self, dataset, options=None):
        """Batches of `dataset` as DTensors split over the batch axis."""
        self.check_layout_map()
        return MeshBatches(dataset, self._mesh, self._batch_dim_name)

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        raise NotImplementedError(
            "`ModelParallelReplicator` takes a `tf.data.Dataset` (or arrays) in "
            f"`fit`. Received: dataset_fn={dataset_fn!r}. Build the dataset and "
            "pass it."
        )

    def check_layout_map(self) -> None:
        """Raises if a `LayoutMap` key matched no variable made in `scope()`."""
        unmatched = self._plan.unmatched_keys()
        if unmatched:
            raise ValueError(
                f"The `LayoutMap` keys {unmatched} matched no variable made in "
                "this strategy's scope, so the weights they name would not be "
                "split. Keys match a variable's `path` (e.g. "
                "'decoder_block_0/attention/query/kernel') with `re.fullmatch`. "
                "Fix or remove the keys, and build the model in `scope()`."
            )

    def run(self, fn, args=(), kwargs=None, options=None):
        """Runs `fn` once on the mesh; its outputs come back whole (replicated)."""
        model = getattr(fn, "__self__", None)
        self._warn_once_about(model)
        with (
            dtensor.default_mesh(self._mesh),
            mesh_step(model, self._mesh, self._batch_dim_name),
        ):
            outputs = fn(*args, **(kwargs or {}))
        return tf.nest.map_structure(self._whole, outputs)

    def _warn_once_about(self, model) -> None:
        if not isinstance(model, keras.Model) or model in self._checked_models:
            return
        self._checked_models.add(model)
        names = rows_split_after_concatenation(
            model, self.layout_of, self._batch_dim_name
        )
        if names:
            warnings.warn(
                f"The kernels of {names} are split by their input rows over a "
                "mesh axis, right after a `Concatenate`: DTensor trains such a "
                "layer wrong without an error (docs/layouts.md, 'Where DTensor's "
                "expansion is silently wrong'). Split these kernels by columns "
                "(e.g. `(None, 'model')`) or keep them whole in the `LayoutMap`.",
                stacklevel=3,
            )

    def _whole(self, value):
        if isinstance(value, tf.Tensor) and (
            not tf.executing_eagerly() or dtensor.is_dtensor(value)
        ):
            return gathered(value, self._mesh)
        return value

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={self._mesh.dim_size(n)}" for n in self._mesh.dim_names)
        return f"ModelParallelReplicator(mesh=({dims}), batch={self._batch_dim_name!r})"
