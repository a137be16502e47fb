import json

import pytest

from keras_replicator import cli


def test_demo_trains_both_runs_and_reports_evidence_of_transparency(tmp_path, capsys):
    output = tmp_path / "out"
    code = cli.main(
        [
            "demo",
            "--epochs",
            "2",
            "--batch-size",
            "512",
            "--check-epochs",
            "1",
            "--data-dir",
            str(tmp_path / "tfds"),
            "--output-dir",
            str(output),
        ]
    )
    assert code == 0
    summary = json.loads((output / "summary.json").read_text())
    assert set(summary["runs"]) == {"2 replicas", "1 device"}
    for run in summary["runs"].values():
        assert 0.0 <= run["test_accuracy"] <= 1.0
        assert run["examples_per_second"] > 0
    assert (output / "demo.png").stat().st_size > 10_000

    # Same initial weights, same global batches, SyncBatchNormalization over all
    # replicas. In float64 the replicas compute what one device computes (measured:
    # ~1e-14); in float32 a split batch rounds differently and batch norm + LARS
    # amplify it, so the demo reports the float64 rerun, the float32 gap per epoch
    # and how far apart the curves are, rather than one final number.
    transparency = summary["transparency"]
    float64 = transparency["float64"]
    # An epoch is ceil(1,438 images / 512) = 3 full global batches of the stream.
    assert float64["epochs"] == 1 and float64["steps"] == 3
    per_step = float64["max_weight_difference_per_step"]
    # Every batch agrees to float64 rounding (measured ~1e-14).
    assert max(per_step) < 1e-12
    assert float64["max_weight_difference_per_epoch"] == [per_step[-1]]
    float32 = transparency["float32"]["max_weight_difference_per_epoch"]
    assert len(float32) == 2
    assert summary["max_weight_difference"] == float32[-1]
    # float32 rounding, not another computation: orders above float64's gap, far
    # below the weights' scale, and the training curves coincide.
    assert per_step[-1] < 1e-3 * float32[0] and float32[0] < 1e-2
    curves = transparency["largest_curve_difference"]
    assert curves["loss"] < 1e-2 and curves["accuracy"] < 1e-2
    assert abs(transparency["test_accuracy_difference"]) < 1e-2

    printed = capsys.readouterr().out
    assert "test accuracy" in printed and "examples/s" in printed
    assert "float64, first 3 steps: largest weight difference after each" in printed
    assert "float32, largest weight difference after each epoch" in printed


@pytest.mark.parametrize(
    "arguments, match",
    [
        (["--batch-size", "1", "--replicas", "2"], "batch_size=1, replicas=2"),
        (["--epochs", "0"], "epochs=0"),
        (["--epochs", "2", "--check-epochs", "3"], "check_epochs=3, epochs=2"),
    ],
)
def test_bad_options_fail_before_training(arguments, match):
    with pytest.raises(SystemExit, match=match):
        cli.main(["demo", *arguments])
