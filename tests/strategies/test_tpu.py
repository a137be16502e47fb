import pytest

import keras_replicator as kr


def test_no_tpu_is_a_clear_error(clean_tf_config):
    with pytest.raises(RuntimeError, match="No TPU is reachable") as error:
        kr.TPUReplicator()
    assert "keras_replicator.auto()" in str(error.value)


def test_fp16_on_the_wire_is_refused_before_the_tpu_is_touched(clean_tf_config):
    # float16 is no TPU type: the options are judged before any connection, so
    # the error names the wire format, not the missing TPU.
    options = kr.AllReduceOptions(compression="fp16")
    with pytest.raises(ValueError, match="compression='fp16'.*TPU") as error:
        kr.TPUReplicator(all_reduce=options)
    assert "bf16" in str(error.value)


def test_bf16_on_the_wire_is_kept_for_a_tpu(clean_tf_config):
    options = kr.AllReduceOptions(compression="bf16")
    with pytest.raises(RuntimeError, match="No TPU is reachable"):
        kr.TPUReplicator(all_reduce=options)
