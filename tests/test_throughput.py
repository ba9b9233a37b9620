"""``fedlatent bench --throughput``: the FLOP arithmetic by hand, the bare loop's augmentation and
training, the table and JSON of a tiny run on a CPU, the precision setting, and refused input."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedlatent.cli import main
from fedlatent.config import load_config
from fedlatent.data.augment import Augmentation
from fedlatent.data.compact import Images
from fedlatent.experiment.tooling import throughput as tp
from fedlatent.models import build_model


def _table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]


def test_paper_cnn_flop_per_sample_by_hand() -> None:
    """Multiply-adds of the paper-width CNN on 32×32, layer by layer (sides 30, 30, 14, 12, 12, 5, 3, 3):
    forward 2·MAC, backward 4·MAC less the first convolution's input gradient (the images need none)."""
    convs = [64 * 3 * 9 * 900, 64 * 64 * 900, 128 * 64 * 9 * 196, 128 * 128 * 9 * 144, 128 * 128 * 144,
             256 * 128 * 9 * 25, 256 * 256 * 9 * 9, 256 * 256 * 9]
    macs = sum(convs) + 256 * 256 + 256 * 256 + 256 * 10
    config = tp.run_config("cpu", "auto")
    model = build_model(config.model, tp.SHAPE, tp.CLASSES, "cifar-shaped")
    assert tp.per_sample_flops(model, tp.SHAPE) == (2 * macs, 4 * macs - 2 * convs[0])


def test_rows_are_samples_per_second_times_flop_per_sample() -> None:
    result = {"images": 1000, "flop_per_sample": 3e8, "precision": {tp.BARE: "bf16", tp.FEDLATENT: "fp32"},
              "seconds": {tp.BARE: [2.0, 1.0, 3.0], tp.FEDLATENT: [4.0, 5.0]}, "time_ratio": [2.0, 2.5]}
    bare, fed = tp.rows(result)
    # bare: median 2 s → 500 samples/s → 500 × 3e8 = 0.15 TFLOP/s; fedlatent: median 4.5 s → 222.2/s
    assert bare == [tp.BARE, "bf16", 500.0, "300.0", pytest.approx(0.15), 1.0]
    assert fed[:4] == [tp.FEDLATENT, "fp32", pytest.approx(1000 / 4.5), "300.0"]
    assert fed[4] == pytest.approx(1000 / 4.5 * 3e8 / 1e12)
    assert fed[5] == pytest.approx(0.45)  # median of 1/2 and 1/2.5
    assert tp.tflops(2.0e4, 3.37e8) == pytest.approx(6.74)


def test_crop_flip_takes_a_window_of_the_padded_batch_flipped_or_not() -> None:
    x = torch.arange(3 * 2 * 5 * 6, dtype=torch.float32).reshape(3, 2, 5, 6) + 1.0
    out = tp.crop_flip(x, torch.Generator().manual_seed(0), padding=2)
    padded = torch.nn.functional.pad(x, (2,) * 4)
    assert out.shape == x.shape
    for i in range(3):
        windows = [padded[i, :, t:t + 5, s:s + 6] for t in range(5) for s in range(5)]
        assert any(torch.equal(out[i], w) or torch.equal(out[i], w.flip(-1)) for w in windows)
    x = torch.rand(400, 1, 4, 4)
    same = tp.crop_flip(x, torch.Generator().manual_seed(1), padding=0)  # no margin: the image or its mirror
    kept = (same == x).flatten(1).all(1)
    assert bool((kept | (same == x.flip(-1)).flatten(1).all(1)).all()) and 150 < int(kept.sum()) < 250


def test_the_bare_loop_trains() -> None:
    """A learnable toy: the class sets the images' brightness; the epoch's loss falls."""
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 32).astype(np.int64)
    images = np.clip(60 + 120 * labels[:, None, None, None] + rng.normal(0, 20, (64, 3, 32, 32)), 0, 255)
    torch.manual_seed(0)
    model = build_model(load_config(None, ['model.arch="cnn"']).model, (3, 32, 32), 2, "toy")
    loop = tp.BareLoop(model, images.astype(np.uint8), labels, batch=16, precision="fp32",
                       device=torch.device("cpu"), lr=0.05)
    first = float(loop.step(torch.arange(0, 64, 4)))  # the untrained model's loss (before the step's update)
    losses = [loop.epoch() for _ in range(5)]
    assert first > 0.5 and losses[-1] < 0.2 * first and losses[-1] < losses[0]


def test_the_fedlatent_side_holds_compact_images_with_crop_and_flip() -> None:
    images, labels = tp.random_images(10, 7)
    fed = tp.federation(images, labels, 10)
    assert [len(c.train) for c in fed.clients] == [7] * 10
    assert all(isinstance(c.train.x, Images) for c in fed.clients)
    assert isinstance(fed.augment, Augmentation) and fed.augment.crop_flip
    assert fed.input_shape == (3, 32, 32) and fed.num_classes == 10
    assert torch.equal(fed.clients[3].train.x.data, torch.from_numpy(images[21:28]))


def test_the_precision_reaches_the_run_configuration() -> None:
    config = tp.run_config("cpu", "bf16")
    assert config.model.width == "paper" and config.train.batch_size == tp.BATCH
    assert config.train.precision == "bf16"


def test_a_tiny_throughput_run_prints_the_table_and_writes_the_json(tmp_path, capsys) -> None:
    out = tmp_path / "tp.json"
    assert main(["bench", "--throughput", "--samples", "2", "--reps", "1", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert "10 clients x 2 random uint8 3x32x32" in captured.out and "on cpu" in captured.out
    header, *rows = _table_rows(captured.out)
    assert header == ["side", "precision", "samples/s", "MFLOP/sample", "TFLOP/s", "÷ bare loop (samples/s)"]
    assert [r[:2] for r in rows] == [[tp.BARE, "fp32"], [tp.FEDLATENT, "fp32"]]
    assert rows[0][5] == "1.00" and all(float(r[2]) > 0 for r in rows) and rows[0][3] == "337.0"
    assert all(len(r[2].replace(".", "").replace("e+", "").lstrip("0")) <= 3 for r in rows)  # 3 significant figures
    assert "judgement: " in captured.out and "1 repetition(s) give a rough figure" in captured.out
    raw = json.loads(out.read_text())
    assert raw["images"] == 20 and raw["total_batch"] == 20 and raw["samples_per_client"] == 2
    assert len(raw["seconds"][tp.FEDLATENT]) == 1 and len(raw["seconds"][tp.BARE]) == 2
    assert float(rows[1][5]) == pytest.approx(1 / raw["time_ratio"][0], abs=5e-3)


@pytest.mark.parametrize("ratios, says", [([1.05, 1.02, 1.08], "at the bare loop's speed, 0.95 of its samples/s"),
                                          ([2.0, 2.5, 4.0], "at 0.40 of the bare loop's samples/s (repetitions "
                                                            "0.25-0.50): 2.5× its time")])
def test_the_judgement_says_what_the_ratio_means(ratios: list[float], says: str) -> None:
    line = tp.judgement({"time_ratio": ratios})
    assert line.startswith("judgement: fedlatent trains ") and says in line and "rough" not in line
    assert "2 repetition(s) give a rough figure" in tp.judgement({"time_ratio": ratios[:2]})


@pytest.mark.parametrize("mode", [[], ["--throughput"]])
def test_cuda_on_a_machine_without_cuda_is_refused_in_one_line(mode, monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", *mode, "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device cuda" in err and "no CUDA device" in err


@pytest.mark.parametrize("args", [["--samples", "4"], ["--precision", "bf16"], ["--throughput", "--quick"],
                                  ["--throughput", "--workloads", "a"]])
def test_options_of_the_other_mode_are_refused(args, capsys) -> None:
    assert main(["bench", *args]) == 2
    assert capsys.readouterr().err.count("\n") == 1
