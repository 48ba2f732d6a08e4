"""The batch-instance style normalization (BIN) block of MLA-BIN (Zhu et al.), section 2.3, Eq. (5)-(6).

Eq. (5), one sub-block::

    BIN_sub(f) = Act(IN(BN(Conv(f; theta_C); theta_BN)))       Conv 3x3, Act = ReLU

Eq. (6), the block::

    BIN(f) = MP(BIN_sub_2(BIN_sub_1(f)))

BIN-Net replaces the convolution blocks of the top three encoder levels of a U-Net by BIN blocks
(:class:`feddg.nets.unet.FedDGUNet`, ``bin_levels``). In MONAI's BasicUNet a level's max-pooling sits at the *start*
of the next level (``Down`` = max-pool then two convolutions), so :class:`BINBlock` is only the two sub-blocks and
the pooling of Eq. (6) is the ``max_pooling`` of the following ``Down``; the composition is the same.

Choices the paper leaves open (written down here because no public code exists):

* **BatchNorm before InstanceNorm**, in the paper's order (not IBN-Net's split of the channels between IN and BN).
* **InstanceNorm is not affine** (``affine=False``) and uses the statistics of each instance at test time too
  (``track_running_stats=False``, PyTorch's default). Eq. (5) names the parameters of the convolution and of the BN
  layer only; the IN layer has none. Set ``in_affine=True`` to give it a learned per-channel scale and shift.
* **ReLU**, as Eq. (5) says (``Act``, "ReLU activation function"), although the rest of MONAI's BasicUNet uses
  LeakyReLU(0.1).
* The convolutions keep a bias (like the rest of BasicUNet); it is redundant before a normalization.
* Dropout, when the network has any, goes after IN and before the activation, where MONAI's ``ADN`` ("NDA") puts it.
* The block ignores the network's ``norm`` setting: it always uses BN followed by IN.

What the BN layer still does. An InstanceNorm right after a BatchNorm re-normalizes each instance and channel, so
BN mostly matters through its running statistics and affine parameters, and in the forward pass even those nearly
cancel: per channel, BN is an affine map ``a_c x + b_c`` shared by every instance (batch statistics in training,
running statistics in evaluation, times gamma, plus beta), and for a non-affine IN::

    IN(a x + b) = sign(a) (x - mean) / sqrt(var + eps / a^2)

i.e. plain IN with a per-channel epsilon ``eps / a_c^2`` and the sign of gamma. BN therefore changes the output only
where a feature map is nearly constant (variance comparable to ``eps / a_c^2``) or where gamma turns negative, and
its gamma receives gradient only through that epsilon; beta receives none. The paper's order is kept anyway: it is
what the paper specifies and evaluates (section 3.3, "BIN or IBN"), and its running statistics and affine parameters
are still part of the state dict that FedAvg and MLA average.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class BINSub(nn.Sequential):
    """Eq. (5): ``conv`` (3x3, padding 1) -> ``bn`` (BatchNorm) -> ``inorm`` (InstanceNorm) [-> ``drop``] -> ``act``
    (ReLU).

    Shapes: (B, in_channels, H, W) -> (B, out_channels, H, W).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        dropout: float = 0.0,
        bias: bool = True,
        in_affine: bool = False,
        spatial_dims: int = 2,
    ):
        super().__init__()
        conv = {2: nn.Conv2d, 3: nn.Conv3d}[spatial_dims]
        bn = {2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[spatial_dims]
        inorm = {2: nn.InstanceNorm2d, 3: nn.InstanceNorm3d}[spatial_dims]
        self.add_module("conv", conv(in_channels, out_channels, kernel_size=3, padding=1, bias=bias))
        self.add_module("bn", bn(out_channels))
        self.add_module("inorm", inorm(out_channels, affine=in_affine, track_running_stats=False))
        if dropout:
            self.add_module("drop", nn.Dropout(dropout))
        self.add_module("act", nn.ReLU())


class BINBlock(nn.Sequential):
    """Eq. (6) without its max-pooling (see the module docstring): ``conv_0`` then ``conv_1``, two :class:`BINSub`.

    The sub-blocks are named like those of MONAI's ``TwoConv``, and each one's convolution is ``conv``, so the
    convolution weights of a BIN level have the same state-dict keys as in a standard level
    (``conv_0.conv_0.conv.weight``); the normalization keys differ (``bn.*`` instead of ``adn.N.*``).

    Shapes: (B, in_channels, H, W) -> (B, out_channels, H, W).
    """

    def __init__(self, in_channels: int, out_channels: int, **options: Any):
        """``options``: the keyword arguments of :class:`BINSub` (``dropout``, ``bias``, ``in_affine``,
        ``spatial_dims``), the same for both sub-blocks."""
        super().__init__()
        self.add_module("conv_0", BINSub(in_channels, out_channels, **options))
        self.add_module("conv_1", BINSub(out_channels, out_channels, **options))

    @torch.no_grad()
    def copy_conv_weights_from(self, two_conv: nn.Module) -> None:
        """Take the convolution weights (and biases) of a MONAI ``TwoConv`` with the same widths, so that a BIN-Net
        starts from the same convolutions as the standard network built from the same seed."""
        for name in ("conv_0", "conv_1"):
            src, dst = getattr(two_conv, name).conv, getattr(self, name).conv
            dst.weight.copy_(src.weight)
            if dst.bias is not None and src.bias is not None:
                dst.bias.copy_(src.bias)
