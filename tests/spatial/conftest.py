"""Fixtures of the spatial tests: float64 Keras defaults and shared strategies."""

import keras
import pytest

import keras_replicator as kr


@pytest.fixture
def float64():
    """Keras' float type and dtype policy set to float64 for one test."""
    floatx, policy = keras.backend.floatx(), keras.config.dtype_policy()
    keras.backend.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    yield
    keras.backend.set_floatx(floatx)
    keras.config.set_dtype_policy(policy)


@pytest.fixture(scope="module")
def strategies():
    """`MultiDeviceReplicator`s on 2 and 4 of the session's logical CPUs."""
    return {n: kr.MultiDeviceReplicator(num_replicas=n) for n in (2, 4)}
