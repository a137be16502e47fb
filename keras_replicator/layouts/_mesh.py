"""A `keras.distribution.DeviceMesh` as a DTensor `Mesh`."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor


def backend_mesh(device_mesh) -> dtensor.Mesh:
    """The DTensor mesh over the same devices, axes and device order.

    Args:
        device_mesh: A `keras.distribution.DeviceMesh` whose devices are local
            device names ("cpu:0", "/gpu:1", "/job:localhost/.../CPU:2").

    Raises:
        ValueError: A device is not a local logical device of this process.

    Example:
    >>> import keras, keras_replicator as kr
    >>> from keras_replicator.layouts._mesh import backend_mesh
    >>> mesh = keras.distribution.DeviceMesh((2,), ["batch"], kr.devices(2))
    >>> backend_mesh(mesh).dim_size("batch")
    2
    """
    names = [_full_name(str(device)) for device in np.ravel(device_mesh.devices)]
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


def _full_name(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device if "/" in device else "/" + device)
    spec = spec.replace(job=spec.job or "localhost", replica=spec.replica or 0)
    spec = spec.replace(task=spec.task or 0)
    return (
        spec.to_string()
        .replace("/device:cpu", "/device:CPU")
        .replace("/device:gpu", "/device:GPU")
    )
