"""model.weights: state dicts in the published key layouts (efficientnet-pytorch's efficientnet-b0,
torchvision's resnet18; 1000-way heads, no num_batches_tracked) load with every non-head tensor
unchanged; mismatches are one line."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from fedlatent.cli import main
from fedlatent.config import ModelConfig
from fedlatent.errors import ConfigError
from fedlatent.models import build_model

torch.set_num_threads(1)
HEADS = {"efficientnet_b0": ("_fc", 1280), "resnet18_imagenet": ("fc", 512)}


def _published(arch: str) -> dict[str, torch.Tensor]:
    """Random tensors under the published checkpoint's keys: the encoder's, a 1000-way head."""
    g = torch.Generator().manual_seed(1)
    model = build_model(ModelConfig(arch=arch), (3, 32, 32), 10)
    state = {k: torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()
             if not k.startswith("classifier.") and not k.endswith("num_batches_tracked")}
    head, width = HEADS[arch]
    state[f"{head}.weight"], state[f"{head}.bias"] = torch.randn(1000, width, generator=g), torch.randn(1000, generator=g)
    return state


@pytest.mark.parametrize("arch", list(HEADS))
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_published_layout_loads_every_non_head_tensor(tmp_path: Path, arch: str, suffix: str) -> None:
    state = _published(arch)
    path = tmp_path / f"weights{suffix}"
    save_file(state, str(path)) if suffix == ".safetensors" else torch.save(state, path)
    torch.manual_seed(0)
    fresh = build_model(ModelConfig(arch=arch), (3, 32, 32), 10)
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch, weights=str(path)), (3, 32, 32), 10)
    loaded = model.state_dict()
    head = HEADS[arch][0]
    for key, tensor in state.items():
        if not key.startswith(f"{head}."):
            assert torch.equal(loaded[key], tensor), key
    assert loaded["classifier.weight"].shape == (10, HEADS[arch][1])  # the head is this task's, as initialised
    assert torch.equal(loaded["classifier.weight"], fresh.state_dict()["classifier.weight"])


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update({"extra.weight": torch.zeros(1)}), "key extra.weight is not in the model"),
    (lambda s: s.pop("layer4.1.bn2.weight"), "lacks the model's key layer4.1.bn2.weight"),
    (lambda s: s.update({"conv1.weight": torch.zeros(64, 3, 3, 3)}), r"conv1.weight has shape \(64, 3, 3, 3\)"),
])
def test_mismatched_weights_name_the_key(tmp_path: Path, change, message: str) -> None:
    state = _published("resnet18_imagenet")
    change(state)
    torch.save(state, tmp_path / "w.pth")
    with pytest.raises(ConfigError, match=message):
        build_model(ModelConfig(arch="resnet18_imagenet", weights=str(tmp_path / "w.pth")), (3, 32, 32), 10)


def test_efficientnet_weights_do_not_fit_resnet(tmp_path: Path) -> None:
    torch.save(_published("efficientnet_b0"), tmp_path / "b0.pth")
    with pytest.raises(ConfigError, match="another model.arch"):
        build_model(ModelConfig(arch="resnet18_imagenet", weights=str(tmp_path / "b0.pth")), (3, 32, 32), 10)


@pytest.mark.parametrize("content, message", [(None, "file not found"), (b"not a checkpoint", "not a readable"),
                                              ([1, 2], "expected a state dict")])
def test_unusable_files_exit_2_with_one_line(tmp_path: Path, capsys, content, message: str) -> None:
    path = tmp_path / "w.pth"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    config = Path(__file__).resolve().parents[2] / "configs" / "digits_fedavg.toml"
    code = main(["run", str(config), "--set", "model.arch=resnet18_imagenet", "--set", f"model.weights={path}",
                 "--set", "train.rounds=1", "--no-progress", "--out", str(tmp_path / "run")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.weights" in err[0] and message in err[0]
