import json

import pytest

from keras_replicator import cli


def test_demo_trains_both_runs_and_writes_the_plot_and_summary(tmp_path, capsys):
    output = tmp_path / "out"
    code = cli.main(
        [
            "demo",
            "--epochs",
            "2",
            "--batch-size",
            "512",
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
    # Same initial weights, same global batches, SyncBatchNormalization over all
    # replicas: the runs agree up to float32 rounding, which LARS at a high rate
    # grows to about 1e-3 in 6 steps (in float64 they agree to 2e-14).
    assert summary["max_weight_difference"] < 1e-2
    assert (output / "demo.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "test accuracy" in printed and "examples/s" in printed


@pytest.mark.parametrize(
    "arguments, match",
    [
        (["--batch-size", "1", "--replicas", "2"], "batch_size=1, replicas=2"),
        (["--epochs", "0"], "epochs=0"),
    ],
)
def test_bad_options_fail_before_training(arguments, match):
    with pytest.raises(SystemExit, match=match):
        cli.main(["demo", *arguments])
