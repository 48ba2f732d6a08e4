"""BIN-Net (MLA-BIN, Eq. 5-6): the block's layer order, where BIN levels go in the U-Net, and that bin_levels=0 is
the plain BasicUNet bit for bit."""

from __future__ import annotations

import pytest
import torch
from monai.networks.nets import BasicUNet
from torch import nn

from feddg.config import ConfigError, config_from_dict
from feddg.nets.bin import BINBlock, BINSub
from feddg.nets.unet import FedDGUNet, build_model
from tests.conftest import TINY_MODEL, tiny_experiment

FEATURES = tuple(TINY_MODEL["features"])  # (8, 8, 16, 32, 64, 8)
LEVELS = ["conv_0", "down_1", "down_2", "down_3", "down_4"]


def _leaves(module: nn.Module) -> list[type]:
    return [type(m) for m in module.modules() if not list(m.children())]


def _level_convs(model: FedDGUNet, level: int) -> nn.Module:
    block = getattr(model, LEVELS[level])
    return block if level == 0 else block.convs


def test_block_is_conv_bn_in_relu_twice():
    block = BINBlock(3, 8)
    layer = [nn.Conv2d, nn.BatchNorm2d, nn.InstanceNorm2d, nn.ReLU]
    assert _leaves(block) == layer * 2
    for sub in (block.conv_0, block.conv_1):
        assert list(dict(sub.named_children())) == ["conv", "bn", "inorm", "act"]
        assert sub.conv.kernel_size == (3, 3) and sub.conv.padding == (1, 1)
        assert not sub.inorm.affine and not sub.inorm.track_running_stats  # Eq. 5 gives IN no parameters
        assert sub.bn.affine and sub.bn.track_running_stats
    assert block.conv_0.conv.in_channels == 3 and block.conv_1.conv.in_channels == 8
    # Dropout goes between IN and the activation, as MONAI's "NDA" order puts it.
    assert _leaves(BINBlock(3, 8, dropout=0.1)) == [nn.Conv2d, nn.BatchNorm2d, nn.InstanceNorm2d, nn.Dropout,
                                                     nn.ReLU] * 2


def test_block_output_is_instance_normalized_then_rectified():
    torch.manual_seed(0)
    sub = BINSub(2, 4)
    x = torch.randn(3, 2, 12, 12) * 5 + 3
    y = sub(x)
    pre = sub.inorm(sub.bn(sub.conv(x)))
    torch.testing.assert_close(pre.mean(dim=(2, 3)), torch.zeros(3, 4), atol=1e-5, rtol=0)
    torch.testing.assert_close(y, torch.relu(pre))


def test_bn_before_non_affine_in_is_in_up_to_epsilon():
    """The docstring's claim: per channel BN is one affine map for the whole batch, which IN undoes; with gamma > 0
    the sub-block equals conv -> IN -> ReLU in training and in evaluation mode."""
    torch.manual_seed(1)
    sub = BINSub(3, 4)
    with torch.no_grad():
        sub.bn.weight.uniform_(0.5, 2.0)
        sub.bn.bias.normal_()
        sub.bn.running_mean.normal_()
        sub.bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(5, 3, 16, 16) * 3 + 2
    reference = torch.relu(nn.functional.instance_norm(sub.conv(x)))
    for train in (True, False):
        sub.train(train)
        torch.testing.assert_close(sub(x), reference, atol=1e-3, rtol=1e-3)
    with torch.no_grad():
        sub.bn.weight[0] = -1.0  # a negative gamma flips the channel before the ReLU
    assert not torch.allclose(sub(x)[:, 0], reference[:, 0], atol=1e-3)


@pytest.mark.parametrize("bin_levels", [0, 1, 3, 5])
def test_top_levels_are_bin_and_the_rest_standard(bin_levels):
    model = FedDGUNet(features=FEATURES, bin_levels=bin_levels)
    assert model.bin_levels == bin_levels
    for level in range(5):
        convs = _level_convs(model, level)
        if level < bin_levels:
            assert isinstance(convs, BINBlock)
        else:
            assert not isinstance(convs, BINBlock)
            assert nn.InstanceNorm2d not in _leaves(convs) and nn.ReLU not in _leaves(convs)
            assert _leaves(convs).count(nn.BatchNorm2d) == 2
        if level:  # Down keeps its max-pooling first: Eq. 6's MP, seen from the next level
            down = getattr(model, LEVELS[level])
            assert list(dict(down.named_children())) == ["max_pooling", "convs"]
            assert isinstance(down.max_pooling, nn.MaxPool2d)
    for block in model.decoder_blocks + [model.final_conv]:
        assert nn.InstanceNorm2d not in _leaves(block) and not any(isinstance(m, BINSub) for m in block.modules())


@pytest.mark.parametrize("bin_levels", [0, 3, 5])
def test_output_shapes(bin_levels):
    model = FedDGUNet(in_channels=3, out_channels=2, features=FEATURES, bin_levels=bin_levels)
    x = torch.randn(2, 3, 32, 32)
    assert model(x).shape == (2, 2, 32, 32)
    logits, (u2, u1) = model.forward_with_features(x)
    assert logits.shape == (2, 2, 32, 32)
    assert u2.shape == (2, FEATURES[1], 16, 16) and u1.shape == (2, FEATURES[5], 32, 32)
    logits.mean().backward()  # trains: gradients reach the first BIN convolution
    assert model.conv_0.conv_0.conv.weight.grad is not None


def test_bin_levels_zero_is_the_plain_basic_unet_bit_for_bit():
    kw = {"spatial_dims": 2, "in_channels": 1, "out_channels": 1, "features": FEATURES, "norm": "batch",
          "dropout": 0.0}
    torch.manual_seed(7)
    old = BasicUNet(**kw)
    torch.manual_seed(7)
    new = FedDGUNet(features=FEATURES, bin_levels=0)
    a, b = old.state_dict(), new.state_dict()
    assert list(a) == list(b)
    assert all(a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a)
    assert list(dict(old.named_modules())) == list(dict(new.named_modules()))
    x = torch.randn(2, 1, 32, 32)
    assert torch.equal(old.eval()(x), new.eval()(x))


def test_bin_convolutions_start_from_the_standard_initialization():
    torch.manual_seed(3)
    plain = FedDGUNet(features=FEATURES).state_dict()
    after_plain = torch.rand(3)
    torch.manual_seed(3)
    bin3 = FedDGUNet(features=FEATURES, bin_levels=3).state_dict()
    assert torch.equal(torch.rand(3), after_plain)  # and the global RNG continues as with bin_levels=0
    shared = [k for k in bin3 if k in plain]
    assert "conv_0.conv_0.conv.weight" in shared and "down_2.convs.conv_1.conv.bias" in shared
    assert all(torch.equal(plain[k], bin3[k]) for k in shared)
    # only the normalization entries of the three BIN levels differ in name
    assert {k.split(".")[0] for k in set(bin3) ^ set(plain)} == {"conv_0", "down_1", "down_2"}
    assert all(".bn." in k for k in set(bin3) - set(plain))


@pytest.mark.parametrize("bad", [-1, 6, 2.5, True, "3"])
def test_config_rejects_bad_bin_levels(bad):
    exp = tiny_experiment("prostate")
    exp["model"]["bin_levels"] = bad
    with pytest.raises(ConfigError, match="model.bin_levels"):
        config_from_dict(exp)
    if not isinstance(bad, str):
        with pytest.raises(ValueError, match="bin_levels"):
            FedDGUNet(features=FEATURES, bin_levels=bad)


def test_config_default_and_build_model_passes_bin_levels():
    exp = tiny_experiment("prostate")
    assert config_from_dict(exp).model.bin_levels == 0  # absent from older feddg.yaml files: plain U-Net
    assert not any(isinstance(m, BINBlock) for m in build_model(config_from_dict(exp)).modules())
    exp["model"]["bin_levels"] = 3
    cfg = config_from_dict(exp)
    model = build_model(cfg)
    assert model.bin_levels == 3
    assert sum(isinstance(m, BINBlock) for m in model.modules()) == 3
    assert cfg.to_dict()["model"]["bin_levels"] == 3
