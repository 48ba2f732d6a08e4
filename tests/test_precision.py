"""Mixed precision (train.amp): auto is float32 on the CPU, fp16 is refused there, bf16 autocasts the forward pass
while losses and weights stay float32, and every training loop honours it."""

from __future__ import annotations

import copy

import pytest
import torch

from feddg.methods.episodic import train_episodic
from feddg.nets.unet import FedDGUNet
from feddg.precision import Precision, PrecisionError, autocast_dtype
from feddg.training import segmentation_loss, train_epochs

CPU = torch.device("cpu")


def test_auto_is_off_on_the_cpu_and_named_modes_are_what_they_say():
    assert autocast_dtype("auto", CPU) is None
    assert autocast_dtype("off", CPU) is None
    assert autocast_dtype("bf16", CPU) is torch.bfloat16
    assert Precision("auto", CPU).describe() == "float32"
    assert Precision("bf16", CPU).describe() == "bfloat16 autocast"


def test_fp16_on_the_cpu_and_unknown_modes_are_refused_by_name():
    with pytest.raises(PrecisionError, match="train.amp: fp16 needs a CUDA device"):
        Precision("fp16", CPU)
    with pytest.raises(PrecisionError, match="train.amp: expected one of"):
        autocast_dtype("fp8", CPU)


def test_the_schema_refuses_an_unknown_mode():
    from feddg.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match="train.amp"):
        config_from_dict({"data": {"task": "prostate", "root": None}, "train": {"amp": "half"}})


def _batches(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"image": torch.randn(2, 1, 32, 32, generator=g),
             "label": (torch.rand(2, 1, 32, 32, generator=g) > 0.7).float()} for _ in range(n)]


def _train(mode: str):
    torch.manual_seed(0)
    model = FedDGUNet(features=(4, 4, 8, 8, 8, 4))
    start = copy.deepcopy(model)
    seen = []
    model.final_conv.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    result = train_epochs(model, _batches(), torch.optim.Adam(model.parameters(), 1e-3), 1, CPU,
                          precision=Precision(mode, CPU))
    return model, start, result, seen


def test_bf16_autocasts_the_forward_pass_and_keeps_float32_weights_close_to_fp32():
    fp32, start, r32, seen32 = _train("off")
    bf16, _, r16, seen16 = _train("bf16")
    assert set(seen32) == {torch.float32} and set(seen16) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in bf16.parameters())
    assert r16.steps == r32.steps == 3 and abs(r16.mean_loss - r32.mean_loss) < 0.02
    moved = sum((a - b).abs().sum() for a, b in zip(fp32.parameters(), start.parameters()))
    apart = sum((a - b).abs().sum() for a, b in zip(fp32.parameters(), bf16.parameters()))
    assert 0 < apart < 0.5 * moved  # both train, to nearby weights


def test_the_episodic_step_honours_the_precision():
    def run(mode):
        torch.manual_seed(0)
        model = FedDGUNet(features=(4, 4, 8, 8, 8, 4))
        seen = []
        model.final_conv.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        bank = {"other": torch.rand(3, 1, 3, 3)}
        result = train_episodic(model, _batches(2), torch.optim.Adam(model.parameters(), 1e-3), CPU, bank, "own",
                                segmentation_loss(), None, precision=Precision(mode, CPU))
        return result, set(seen)

    r32, seen32 = run("off")
    r16, seen16 = run("bf16")
    assert seen32 == {torch.float32} and seen16 == {torch.bfloat16}
    assert r16.steps == r32.steps == 2 and abs(r16.mean_loss - r32.mean_loss) < 0.05


class _Scaled:
    """A precision that scales the loss by 1024 in float32: the episodic step's result must not change."""

    loss_scale = 1024.0

    def autocast(self):
        from contextlib import nullcontext

        return nullcontext()

    def backward(self, loss):
        (loss * self.loss_scale).backward()

    def step(self, optimizer):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.div_(self.loss_scale)
        optimizer.step()


def test_loss_scaling_leaves_the_episodic_update_unchanged():
    def run(precision):
        torch.manual_seed(0)
        model = FedDGUNet(features=(4, 4, 8, 8, 8, 4))
        bank = {"other": torch.rand(3, 1, 3, 3)}
        train_episodic(model, _batches(2), torch.optim.SGD(model.parameters(), 0.1), CPU, bank, "own",
                       segmentation_loss(), None, meta_step_size=0.1, precision=precision)
        return model

    plain, scaled = run(None), run(_Scaled())
    for a, b in zip(plain.parameters(), scaled.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
