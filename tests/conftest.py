"""Test session setup: 4 logical CPU devices, made before TensorFlow starts.

Every in-process test shares them: strategies with 1, 2 or 4 replicas use the first
devices. Multi-worker tests start their own worker processes.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pathlib

import pytest  # noqa: E402

# Variants that `make test` leaves to `make test-slow` to stay under 20 minutes on 2
# cores (issue 34). Each is reviewed: what it checks is also checked in the default
# run by the test named beside it. Node id prefix -> that test.
RUN_IN_TEST_SLOW = {
    "communication/test_all_reduce_multi_worker.py::test_eager_fit_trains_on_two_"
    "workers_like_one_device": "conformance multi-worker-2 run_eagerly",
    "communication/test_all_reduce_multi_worker.py::test_two_workers_train_to_the_"
    "one_device_weights[bf16-collective]": "the same test [default-is-the-ring]",
    "communication/test_all_reduce.py::test_lossless_options_train_to_the_one_device_"
    "weights[tiny]": "the same test [default], [one-pack]",
    "communication/test_all_reduce.py::test_compressed_wire_stays_close_to_one_"
    "device[bf16": "the same test [fp16-0.002]",
    "communication/test_hierarchy_multi_worker.py": "test_hierarchy.py, in process",
    "communication/test_hierarchy.py::test_hierarchies_train_to_the_one_device_"
    "weights_float32": "the same hierarchies in float64",
    "keras_integration/test_transformer_multi_worker.py": (
        "conformance multi-worker-2 transformer_embeddings"
    ),
    "keras_integration/test_mixed_precision.py::test_an_overflow_on_one_worker_"
    "skips_the_step_on_both": "conformance multi-worker-2 mixed_float16_overflow",
    "keras_integration/test_gradient_accumulation.py::test_two_workers_accumulate_"
    "locally_and_match_one_device": "conformance multi-worker-2 gradient_accumulation",
    "_files/test_worker_files.py::test_keras_backup_and_restore_resumes_exactly_"
    "after_a_restart": "launch/test_launcher.py kill_mid_epoch_restart_resumes_exactly",
    "parameter_server/test_training.py::test_fit_evaluate_predict_on_datasets_made_"
    "on_the_chief": "test_fit_evaluate_predict_match_one_device",
    "parameter_server/test_training.py::test_the_tutorials_fit_runs_and_counts_"
    "every_scheduled_step": "test_custom_loop.py's tutorial, test_steps.py",
    "examples/test_sngan_digits.py": "clients kerasio_gan_without_call",
    "examples/test_d4pg_control.py::test_train_runs_on_two_replicas": (
        "test_two_replica_update_matches_one_device"
    ),
    "examples/test_spatial_segmentation.py": "spatial/test_unet.py",
    "data/test_image_pipeline.py::test_two_workers_read_disjoint_shards_and_fit": (
        "test_two_input_pipelines_read_disjoint_files_covering_the_dataset"
    ),
    "data/test_image_header.py::test_images_over_max_pixels_raise_naming_the_record_"
    "and_the_budget[jpeg]": "the same test [png]",
    "spatial/test_partition.py::test_five_float32_fit_steps_stay_within_1e_5_of_one_"
    "device": "test_five_fit_steps_give_the_weights_of_one_device",
    "spatial/test_partition.py::test_five_fit_steps_give_the_weights_of_one_device"
    "[4-2-sync_all]": "the same test [2-2-plain] and the other cases",
    "spatial/test_saving.py::test_a_model_compiled_after_partition_saves_its_"
    "optimizer": "test_weights_files_are_the_unpartitioned_models",
    "sharding/test_update.py::test_weights_and_state_equal_the_unsharded_run[adam-4]": (
        "the same test's other cases"
    ),
    "sharding/test_saving.py::test_a_keras_file_continues_anywhere[4-True]": (
        "the same test [1-False], [2-False]"
    ),
    "sharding/test_norm_optimizers.py::test_norm_optimizers_sharded_equal_unsharded"
    "[lamb-2]": "the same test [lars-2]",
    "optimizers/test_loss_aware.py::test_fit_on_two_workers_trains_as_one_device"
    "[neumann]": "the same test [nlcg]; test_neumann_resume.py",
    "optimizers/test_loss_aware.py::test_compressed_all_reduce_keeps_replicas_"
    "identical": "communication/test_all_reduce.py compressed wire",
    "testing/test_conformance.py::test_local_strategy_passes[multi-device-4": (
        "the same checks on multi-device-2 and multi-worker-2"
    ),
    "launch/test_data_service.py::test_launched_workers_train_from_the_service_and_"
    "share_each_epoch": "data/test_service.py (the service, in process)",
    "spatial/test_partition.py::test_image_shaped_outputs_are_tiled_and_stitched": (
        "spatial/test_unet.py (a segmentation map, tiled and stitched)"
    ),
    "launch/test_cluster.py::test_two_slurm_tasks_launch_one_worker_each": (
        "test_slurm_mode_resolves_this_tasks_tf_config"
    ),
}
_CLIENTS = "clients/test_clients.py::test_ours_on_two_replicas_matches_the_reference"
RUN_IN_TEST_SLOW.update(
    {
        f"{_CLIENTS}[{name}]": "the other clients of the same guide"
        for name in (
            "tf_custom_training_iterators",
            "tf_keras_fit_with_callbacks",
            "tf_save_and_load_saved_model",
            "kerasio_train_step_lower_level",
            "kerasio_train_step_sample_weight",
            "tf_input_distributed_datasets",
        )
    }
)


def pytest_collection_modifyitems(config, items):
    seen = set()
    for item in items:
        node = item.nodeid.removeprefix("tests/")
        for prefix in RUN_IN_TEST_SLOW:
            if node.startswith(prefix):
                item.add_marker(pytest.mark.slow)
                seen.add(prefix)
    # A renamed test must not silently come back into (or vanish from) the list.
    if _whole_suite(config):
        missing = set(RUN_IN_TEST_SLOW) - seen
        if missing:
            raise pytest.UsageError(
                f"tests/conftest.py RUN_IN_TEST_SLOW names no test: {sorted(missing)}"
            )


def pytest_configure(config):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if not tf.config.get_logical_device_configuration(cpu):
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 4
        )


@pytest.fixture
def float64():
    """Keras' float type and dtype policy set to float64 for one test."""
    import keras

    floatx, policy = keras.backend.floatx(), keras.config.dtype_policy()
    keras.backend.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    yield
    keras.backend.set_floatx(floatx)
    keras.config.set_dtype_policy(policy)


@pytest.fixture
def clean_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    for name in ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE"):
        monkeypatch.delenv(name, raising=False)


def _whole_suite(config) -> bool:
    """Whether pytest was asked for the whole of tests/ (not a selection)."""
    tests = pathlib.Path(__file__).parent.resolve()
    args = [pathlib.Path(a.split("::")[0]).resolve() for a in config.args] or [
        pathlib.Path.cwd()
    ]
    return any(a in (tests, tests.parent) for a in args)
