import pytest

import keras_replicator as kr


def test_no_tpu_is_a_clear_error(clean_tf_config):
    with pytest.raises(RuntimeError, match="No TPU is reachable") as error:
        kr.TPUReplicator()
    assert "keras_replicator.auto()" in str(error.value)
