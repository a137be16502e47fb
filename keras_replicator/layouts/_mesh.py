"""A `keras.distribution.DeviceMesh` as a DTensor `Mesh`."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from keras_replicator.layouts._clients import global_device_names


def backend_mesh(device_mesh) -> dtensor.Mesh:
    """The DTensor mesh over the same devices, axes and device order.

    Args:
        device_mesh: A `keras.distribution.DeviceMesh` whose devices are local
            device names ("cpu:0", "/gpu:1", "/job:localhost/.../CPU:2"), or, in
            a multi-worker run, every worker's as `kr.devices(n)` names them.

    Raises:
        ValueError: A device is not a local logical device of this process, or
            a multi-worker mesh does not list the workers' devices in order.

    Example:
    >>> import keras, keras_replicator as kr
    >>> from keras_replicator.layouts._mesh import backend_mesh
    >>> mesh = keras.distribution.DeviceMesh((2,), ["batch"], kr.devices(2))
    >>> backend_mesh(mesh).dim_size("batch")
    2
    """
    names = [_full_name(str(device)) for device in np.ravel(device_mesh.devices)]
    if dtensor.num_clients() > 1:
        return _distributed_mesh(device_mesh, names)
    local = {_full_name(device.name) for device in tf.config.list_logical_devices()}
    missing = [name for name in names if name not in local]
    if missing:
        raise ValueError(
            "Every device of the `DeviceMesh` must be a local logical device. "
            f"Received: devices={list(np.ravel(device_mesh.devices))}, of which "
            f"{missing} are not among {sorted(local)}. Build the mesh from "
            "`kr.devices(n)`."
        )
    dims = list(zip(device_mesh.axis_names, device_mesh.shape))
    return dtensor.create_mesh(dims, devices=names)


def _distributed_mesh(device_mesh, names: list[str]) -> dtensor.Mesh:
    """The mesh of a multi-worker run: every worker's devices, this one's local.

    DTensor numbers a worker's devices after the previous workers' (its
    collectives find a device by that number), so the mesh must list them
    worker by worker, as `kr.devices(n)` does.
    """
    expected = [_full_name(name) for name in _global_names(names)]
    if names != expected:
        raise ValueError(
            "In a multi-worker run the `DeviceMesh` must hold every worker's "
            "devices, worker by worker, as `kr.devices(n)` gives them. Received: "
            f"devices={list(np.ravel(device_mesh.devices))}; expected {expected}. "
            f"Build the mesh from `kr.devices({len(names)})`."
        )
    local_ids = [
        index
        for index, name in enumerate(names)
        if name.startswith("/job:" + dtensor.full_job_name() + "/")
    ]
    return dtensor.Mesh(
        dim_names=list(device_mesh.axis_names),
        global_device_ids=np.arange(len(names)).reshape(device_mesh.shape),
        local_device_ids=local_ids,
        local_devices=[names[index] for index in local_ids],
    )


def _global_names(names: list[str]) -> list[str]:
    count = dtensor.num_clients()
    device_type = tf.DeviceSpec.from_string(names[0]).device_type or "CPU"
    return global_device_names(
        dtensor.job_name(), count, len(names) // count, device_type
    )


def _full_name(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device if "/" in device else "/" + device)
    spec = spec.replace(job=spec.job or "localhost", replica=spec.replica or 0)
    spec = spec.replace(task=spec.task or 0)
    return (
        spec.to_string()
        .replace("/device:cpu", "/device:CPU")
        .replace("/device:gpu", "/device:GPU")
    )
