"""The segmentation network: MONAI's BasicUNet with named encoder and decoder blocks.

BasicUNet (rather than MONAI's nested ``UNet``) keeps every block as a named attribute, which later methods
need: BIN-Net replaces encoder blocks, and ELCFS's boundary loss reads the activations of the last two
decoder layers ("the activation map from the last two deconvolutional layers", ELCFS section 4.2).
"""

from __future__ import annotations

from typing import Sequence

import torch
from monai.networks.nets import BasicUNet

from feddg.config import FedDGConfig
from feddg.nets.bin import BINBlock

MAX_BIN_LEVELS = 5


class FedDGUNet(BasicUNet):
    """2D U-Net: five encoder blocks (``conv_0``, ``down_1`` .. ``down_4``), four decoder blocks
    (``upcat_4`` .. ``upcat_1``) and a 1x1 ``final_conv``; output logits, one channel per structure
    (multi-label: fundus disc and cup overlap, so each structure gets its own sigmoid).

    Args:
        in_channels: 1 for MRI, 3 for RGB fundus.
        out_channels: number of structures.
        features: six widths as MONAI's BasicUNet takes them (five encoder levels + the last decoder level).
        norm: "batch" or "instance".
        dropout: dropout probability inside the blocks.
        bin_levels: BIN-Net (MLA-BIN, section 2.3): the top ``bin_levels`` encoder levels (0-5; ``conv_0``, then
            ``down_1``, ``down_2``, ...) use a :class:`~feddg.nets.bin.BINBlock` (conv -> BN -> IN -> ReLU, twice)
            for their two convolutions; deeper levels and the decoder stay standard. The paper uses 3. A ``down_k``
            keeps its ``max_pooling`` and gets the BIN block as its ``convs``. The BIN convolutions start from the
            weights the standard ones would have had, so ``bin_levels`` does not change the convolutions' seeded
            initialization; 0 builds exactly the plain BasicUNet.

    Shapes: input (B, in_channels, H, W) with H, W multiples of 16; output (B, out_channels, H, W).
    """

    def __init__(
        self,
        in_channels: int = 1,
        out_channels: int = 1,
        features: Sequence[int] = (16, 16, 32, 64, 128, 16),
        norm: str = "batch",
        dropout: float = 0.0,
        bin_levels: int = 0,
    ):
        if isinstance(bin_levels, bool) or not isinstance(bin_levels, int) or not 0 <= bin_levels <= MAX_BIN_LEVELS:
            raise ValueError(f"bin_levels must be an integer from 0 to {MAX_BIN_LEVELS}, got {bin_levels!r}")
        super().__init__(
            spatial_dims=2,
            in_channels=in_channels,
            out_channels=out_channels,
            features=tuple(features),
            norm=norm,
            dropout=dropout,
        )
        self.bin_levels = bin_levels
        widths = [in_channels, *tuple(features)[:5]]
        for level in range(bin_levels):
            with torch.random.fork_rng(devices=[]):  # its weights are copied below: leave the global RNG as
                block = BINBlock(widths[level], widths[level + 1], dropout=dropout)  # bin_levels=0 leaves it
            if level == 0:
                block.copy_conv_weights_from(self.conv_0)
                self.conv_0 = block
            else:
                down = getattr(self, f"down_{level}")
                block.copy_conv_weights_from(down.convs)
                down.convs = block  # replaces the entry in place: max_pooling stays first

    @property
    def encoder_blocks(self) -> list[torch.nn.Module]:
        return [self.conv_0, self.down_1, self.down_2, self.down_3, self.down_4]

    @property
    def decoder_blocks(self) -> list[torch.nn.Module]:
        return [self.upcat_4, self.upcat_3, self.upcat_2, self.upcat_1]

    def forward_with_features(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits plus the activations of the last two decoder layers, ``upcat_2`` (B, f[1], H/2, W/2)
        and ``upcat_1`` (B, f[5], H, W)."""
        x0 = self.conv_0(x)
        x1 = self.down_1(x0)
        x2 = self.down_2(x1)
        x3 = self.down_3(x2)
        x4 = self.down_4(x3)
        u4 = self.upcat_4(x4, x3)
        u3 = self.upcat_3(u4, x2)
        u2 = self.upcat_2(u3, x1)
        u1 = self.upcat_1(u2, x0)
        return self.final_conv(u1), [u2, u1]


def build_model(cfg: FedDGConfig) -> FedDGUNet:
    """The network a configuration describes; every site and the server build the same one."""
    return FedDGUNet(
        in_channels=cfg.data.in_channels,
        out_channels=len(cfg.data.label_names),
        features=cfg.model.features,
        norm=cfg.model.norm,
        dropout=cfg.model.dropout,
        bin_levels=cfg.model.bin_levels,
    )


def select_device() -> torch.device:
    """CUDA when available, else CPU. NVFlare assigns a site its GPU through CUDA_VISIBLE_DEVICES, so the
    first visible device is the one it gave us.

    On the CPU, denormal floats are flushed to zero: small U-Nets produce them in the backward pass and each
    one costs a slow micro-code path (measured here: 3.7 s per training step instead of 0.15 s)."""
    if torch.cuda.is_available():
        return torch.device("cuda:0")
    torch.set_flush_denormal(True)
    return torch.device("cpu")
