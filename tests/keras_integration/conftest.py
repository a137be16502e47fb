"""Fixtures shared by the Keras-integration tests."""

import keras
import pytest


@pytest.fixture
def float64():
    """Keras in float64 for one test (floatx and the dtype policy), then back."""
    policy = keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    yield
    keras.config.set_floatx("float32")
    keras.config.set_dtype_policy(policy)
