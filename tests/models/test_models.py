"""Shapes, taps, parameter counts, size checks and determinism of the image models."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlatent.config import load_config
from fedlatent.errors import ConfigError
from fedlatent.models import cnn, mobilenet, resnet
from fedlatent.models.base import FedModel
from fedlatent.models.mobilenet import InvertedResidual, MobileNetV2
from fedlatent.models.resnet import ResNet

torch.set_num_threads(1)

N = 4


def _input(shape: tuple[int, int, int], n: int = N) -> torch.Tensor:
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- small CNN

def _small_cnn_params(in_ch: int, widths: tuple[int, int, int], classes: int, fc: int = 256) -> int:
    """Count from the FedUV layer list: bias-free convs + BN(γ, β); FCs with bias + BN; classifier."""
    a, b, c = widths
    convs = [(in_ch, a, 3), (a, a, 1), (a, b, 3), (b, b, 3), (b, b, 1), (b, c, 3), (c, c, 3), (c, c, 1)]
    total = sum(cin * cout * k * k + 2 * cout for cin, cout, k in convs)
    total += (c * fc + fc) + 2 * fc          # FC 64→256 + BN
    total += (fc * fc + fc) + 2 * fc         # FC 256→256 + BN
    total += fc * classes + classes          # classifier
    return total


@pytest.mark.parametrize("width,widths,in_ch", [("release", (16, 32, 64), 3), ("paper", (64, 128, 256), 3),
                                                ("release", (16, 32, 64), 1)])
def test_small_cnn_parameter_count_matches_spec(width: str, widths: tuple[int, int, int], in_ch: int) -> None:
    model = cnn.build((in_ch, 32, 32), 10, width=width)
    assert sum(p.numel() for p in model.parameters()) == _small_cnn_params(in_ch, widths, 10)


def test_small_cnn_layers_have_no_padding_and_no_bias() -> None:
    model = cnn.build((3, 32, 32), 10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 8
    assert all(c.padding == (0, 0) and c.bias is None for c in convs)
    assert [c.kernel_size[0] for c in convs] == [3, 1, 3, 3, 1, 3, 3, 1]
    assert [c.stride[0] for c in convs] == [1, 1, 2, 1, 1, 2, 1, 1]


def test_small_cnn_shapes_and_taps() -> None:
    model = cnn.build((3, 32, 32), 10)
    out = model(_input((3, 32, 32)))
    assert out.logits.shape == (N, 10) and out.z.shape == (N, 256) and model.z_dim == 256
    assert out.features == {}
    out = model(_input((3, 32, 32)), taps=("fc1", "pool", "conv8"))
    assert set(out.features) == {"fc1", "pool", "conv8"}
    assert out.features["fc1"].shape == (N, 256)
    assert out.features["pool"].shape == (N, 64)
    assert out.features["conv8"].shape == (N, 64, 3, 3)
    out = model(_input((3, 32, 32)), taps=model.tap_names)
    assert set(out.features) == set(model.tap_names)
    assert torch.equal(out.features["fc2"], out.z)  # no projector: the encoder output is z
    sides = [out.features[f"conv{i}"].shape[-1] for i in range(1, 9)]
    assert sides == [30, 30, 14, 12, 12, 5, 3, 3]


def test_small_cnn_minimum_size_is_exact() -> None:
    assert cnn.SmallCNN.min_input_size() == 21
    model = cnn.build((1, 21, 21), 10)  # the minimum works: the last conv maps are 1×1
    out = model(_input((1, 21, 21)), taps=("conv8",))
    assert out.features["conv8"].shape[-2:] == (1, 1)
    with pytest.raises(RuntimeError):  # one pixel less really breaks the network
        model(_input((1, 20, 20)))
    with pytest.raises(ConfigError, match=r"model.arch = 'cnn' needs inputs of at least 21×21 pixels; "
                                          r"data 'digits' gives 8×8"):
        cnn.build((1, 8, 8), 10, data_name="digits")
    with pytest.raises(ConfigError, match="20×32"):
        cnn.build((3, 20, 32), 10)


def test_bad_shapes_and_options_raise_config_error() -> None:
    with pytest.raises(ConfigError, match=r"\(channels, height, width\)"):
        cnn.build((60,), 10, data_name="synthetic")
    with pytest.raises(ConfigError, match="model.width"):
        cnn.build((3, 32, 32), 10, width="huge")
    with pytest.raises(ConfigError, match="model.widht is not an option"):
        cnn.build((3, 32, 32), 10, widht="paper")
    with pytest.raises(ConfigError, match="model.depth"):
        resnet.build((3, 32, 32), 10, depth=34)
    with pytest.raises(ConfigError, match="model.depth is not an option"):
        resnet.build_resnet18((3, 32, 32), 10, depth=50)
    with pytest.raises(ConfigError, match="model.projector_width"):
        resnet.build((3, 32, 32), 10, projector_width=-1)
    with pytest.raises(ConfigError, match="model.projector_layers"):
        mobilenet.build((3, 32, 32), 10, projector_width=8, projector_layers=0)
    with pytest.raises(ConfigError, match="mobilenetv2.*image inputs"):
        mobilenet.build((3, 32), 10)


# ----------------------------------------------------------------------------- ResNet

def test_resnet18_stem_stride1_no_maxpool_and_shapes() -> None:
    model = resnet.build_resnet18((3, 32, 32), 10)
    assert model.stem[0].stride == (1, 1) and model.stem[0].kernel_size == (3, 3)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    out = model(_input((3, 32, 32), n=2), taps=model.tap_names)
    assert out.logits.shape == (2, 10) and out.z.shape == (2, 512)
    shapes = {k: tuple(v.shape[1:]) for k, v in out.features.items()}
    assert shapes == {"stem": (64, 32, 32), "layer1": (64, 32, 32), "layer2": (128, 16, 16),
                      "layer3": (256, 8, 8), "layer4": (512, 4, 4), "pool": (512,)}


def test_resnet18_taps_only_when_asked_and_projector_sets_z_dim() -> None:
    model = resnet.build_resnet18((1, 8, 8), 7)  # digits-sized inputs are fine for ResNet
    out = model(_input((1, 8, 8), n=2))
    assert out.features == {} and out.z.shape == (2, 512) and model.z_dim == 512
    with_proj = resnet.build_resnet18((1, 8, 8), 7, projector_width=128)
    out = with_proj(_input((1, 8, 8), n=2), taps=("pool", "layer3"))
    assert with_proj.z_dim == 128 and out.z.shape == (2, 128) and out.logits.shape == (2, 7)
    assert set(out.features) == {"pool", "layer3"} and out.features["pool"].shape == (2, 512)
    assert with_proj.classifier.in_features == 128
    assert ResNet.min_input_size() == 1


def test_resnet_imagenet_nopool_stem_is_feduvs_16x_network() -> None:
    """FedUV Sec. 4.1: the ImageNet ResNet "removing the initial max-pooling layer": a 7×7 stride-2
    stem and no max-pool, so layer4 sits at 2×2 for a 32×32 input (16×; the CIFAR stem: 4×4, 8×); the
    stem's conv is the only parameter that changes (64·3·(7² − 3²) more weights), for both depths."""
    for depth, dim in ((18, 512), (50, 2048)):
        cifar = resnet.build((3, 32, 32), 10, depth=depth)
        paper = resnet.build((3, 32, 32), 10, depth=depth, stem="imagenet_nopool")
        conv = paper.stem[0]
        assert (conv.kernel_size, conv.stride, conv.padding) == ((7, 7), (2, 2), (3, 3))
        assert not any(isinstance(m, nn.MaxPool2d) for m in paper.modules())
        out = paper.eval()(_input((3, 32, 32), n=2), taps=("stem", "layer4"))
        assert out.features["stem"].shape[-1] == 16 and out.features["layer4"].shape[1:] == (dim, 2, 2)
        count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        assert count(paper) - count(cifar) == 64 * 3 * (49 - 9)
    config = load_config(None, ['model.arch="resnet50"', 'model.stem="imagenet_nopool"', 'data.dataset="synthetic"'])
    assert config.model.options["stem"] == "imagenet_nopool"
    assert load_config(None, ['model.arch="resnet18"', 'data.dataset="synthetic"']).model.options["stem"] == "cifar"
    with pytest.raises(ConfigError, match="model.stem"):
        load_config(None, ['model.arch="resnet18"', 'model.stem="imagenet"'])
    with pytest.raises(ConfigError, match="model.stem"):
        resnet.build((3, 32, 32), 10, stem="7x7")


def test_mobilenet_feddecorr_moon_projector_is_the_releases_head() -> None:
    """The FedDecorr release's MOON head (approach/moon.py): Linear(1280, 640) → ReLU → Linear(640, 256),
    no BatchNorm, z = its 256-d output; the default projector stays FC-BN-ReLU ×2."""
    model = mobilenet.build((3, 8, 8), 10, projector_width=256, projector_form="feddecorr_moon")
    layers = list(model.projector)
    assert [type(m) for m in layers] == [nn.Linear, nn.ReLU, nn.Linear]
    assert (layers[0].in_features, layers[0].out_features, layers[2].out_features) == (1280, 640, 256)
    assert model.z_dim == 256 and not any(isinstance(m, nn.BatchNorm1d) for m in model.projector.modules())
    assert model(_input((3, 8, 8), n=2)).z.shape == (2, 256)
    default = mobilenet.build((3, 8, 8), 10, projector_width=256)
    assert any(isinstance(m, nn.BatchNorm1d) for m in default.projector.modules())
    config = load_config(None, ['model.arch="mobilenetv2"', "model.projector=256", 'model.projector_form="feddecorr_moon"',
                                'data.dataset="synthetic"'])
    assert config.model.options["projector_form"] == "feddecorr_moon"
    with pytest.raises(ConfigError, match="model.projector_form"):
        mobilenet.build((3, 8, 8), 10, projector_width=256, projector_form="moon")
    with pytest.raises(ConfigError, match="projector_layers"):
        mobilenet.build((3, 8, 8), 10, projector_width=256, projector_layers=3, projector_form="feddecorr_moon")


def test_resnet50_single_tiny_forward() -> None:
    model = resnet.build_resnet50((3, 8, 8), 5).eval()
    with torch.no_grad():
        out = model(_input((3, 8, 8), n=1), taps=("layer4",))
    assert out.logits.shape == (1, 5) and out.z.shape == (1, 2048)
    assert out.features["layer4"].shape == (1, 2048, 1, 1)


# ----------------------------------------------------------------------------- MobileNetV2

def test_mobilenet_shapes_taps_and_projector() -> None:
    model = mobilenet.build((3, 16, 16), 10)
    out = model(_input((3, 16, 16), n=2), taps=("pool", "conv_last", "stage3", "stem"))
    assert out.logits.shape == (2, 10) and out.z.shape == (2, 1280)
    shapes = {k: tuple(v.shape[1:]) for k, v in out.features.items()}
    assert shapes == {"stem": (32, 16, 16), "stage3": (32, 8, 8), "conv_last": (1280, 2, 2), "pool": (1280,)}
    assert model(_input((3, 16, 16), n=2)).features == {}
    with_proj = mobilenet.build((3, 16, 16), 10, projector_width=64)
    assert with_proj.z_dim == 64 and with_proj(_input((3, 16, 16), n=2)).z.shape == (2, 64)
    assert MobileNetV2.min_input_size() == 1


def test_mobilenet_projection_relu_same_parameters_other_output() -> None:
    """SphereFed's Table 14 form: a ReLU after each projection, inside the block, before the sum."""
    plain = mobilenet.build((3, 8, 8), 10)
    relu = mobilenet.build((3, 8, 8), 10, projection_relu=True)
    assert [(n, p.shape) for n, p in plain.named_parameters()] == [(n, p.shape) for n, p in relu.named_parameters()]
    relu.load_state_dict(plain.state_dict())
    plain.eval()
    relu.eval()
    x = _input((3, 8, 8), n=2)
    assert not torch.allclose(plain(x).logits, relu(x).logits)
    block, reference = relu.stages[1][1], plain.stages[1][1]  # a stride-1 block with an identity shortcut
    h = plain.stages[1][0](plain.stages[0](torch.randn(2, 32, 8, 8, generator=torch.Generator().manual_seed(0))))
    with torch.no_grad():
        torch.testing.assert_close(block(h), torch.relu(reference.body(h)) + h)
    config = load_config(None, ['model.arch="mobilenetv2"', "model.projection_relu=true"])
    assert config.model.options["projection_relu"] is True
    with pytest.raises(ConfigError, match="model.projection_relu"):
        load_config(None, ['model.arch="resnet18"', "model.projection_relu=true"])


def test_mobilenet_residual_rule() -> None:
    model = mobilenet.build((3, 32, 32), 10)
    blocks = [b for stage in model.stages for b in stage]
    assert len(blocks) == 1 + 2 + 3 + 4 + 3 + 3 + 1
    stride = {id(b): b.body[3].stride[0] for b in blocks}  # the depthwise conv carries the stride
    first = blocks[0]  # (1,16,1,1): 32→16, stride 1 → 1×1 conv + BN shortcut
    assert stride[id(first)] == 1 and isinstance(first.shortcut, nn.Sequential)
    assert isinstance(first.shortcut[0], nn.Conv2d) and first.shortcut[0].kernel_size == (1, 1)
    assert isinstance(first.shortcut[1], nn.BatchNorm2d)
    assert isinstance(blocks[2].shortcut, nn.Identity)     # second 24-block: 24→24, stride 1
    assert blocks[3].shortcut is None and stride[id(blocks[3])] == 2  # first 32-block: stride 2
    for b in blocks:  # the rule itself, everywhere
        assert (b.shortcut is None) == (stride[id(b)] == 2)
    # a stride-1 block really adds its shortcut
    block = InvertedResidual(8, 8, 6, 1).eval()
    x = _input((8, 4, 4), n=1)
    with torch.no_grad():
        assert torch.allclose(block(x), block.body(x) + x)
    assert all(isinstance(m, nn.ReLU) for m in model.modules() if isinstance(m, (nn.ReLU, nn.ReLU6)))


# ----------------------------------------------------------------------------- all models

def _small_models() -> list[tuple[str, FedModel, tuple[int, int, int]]]:
    return [("cnn", cnn.build((3, 24, 24), 3), (3, 24, 24)),
            ("resnet18", resnet.build_resnet18((1, 8, 8), 3, projector_width=16), (1, 8, 8)),
            ("mobilenetv2", mobilenet.build((3, 8, 8), 3, projector_width=16), (3, 8, 8))]


@pytest.mark.parametrize("index", range(3))
def test_backward_and_deterministic_eval(index: int) -> None:
    torch.manual_seed(0)
    name, model, shape = _small_models()[index]
    x = _input(shape)
    out = model(x, taps=model.tap_names[:2])
    loss = nn.functional.cross_entropy(out.logits, torch.arange(N) % 3) + sum(f.mean() for f in out.features.values())
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads), name
    model.eval()
    with torch.no_grad():
        first, second = model(x), model(x)
    assert torch.equal(first.logits, second.logits) and torch.equal(first.z, second.z)


def test_tap_names_are_listed_deepest_first() -> None:
    assert cnn.SmallCNN.tap_names[:3] == ("fc2", "fc1", "pool") and cnn.SmallCNN.tap_names[-1] == "conv1"
    assert ResNet.tap_names[0] == "pool" and ResNet.tap_names[-1] == "stem"
    assert MobileNetV2.tap_names[0] == "pool" and MobileNetV2.tap_names[-1] == "stem"
