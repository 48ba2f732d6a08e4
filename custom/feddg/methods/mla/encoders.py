"""The shared feature encoders of MLA-BIN (Zhu et al.), section 2.2, Eq. (2)::

      C_n^t = GAP(Enc(x_n^t; theta_Enc))                          (:func:`encode`)

Each site maps its images to feature vectors with a shared encoder and global average pooling and sends them to
the server, which stacks them into the domain feature bank (:mod:`feddg.methods.mla.attention`).

Choice the paper leaves open (no public code exists): the **encoder**. The paper uses "a pre-trained CNN model with
unified pre-training weights". Nothing can be downloaded here, so the default shared encoder is a small CNN with
*random* weights drawn from a seed (:func:`build_feature_encoder`): every site rebuilds the identical network from
the seed alone. Random convolution + ReLU + GAP features are statistics of local intensity patterns, which is what
tells acquisition styles apart. The alternative is the encoder of the final global model
(:func:`global_model_encoder`).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from feddg.methods.mla.seeding import default_init, seeded_generator


class RandomEncoder(nn.Module):
    """A small CNN with seeded random weights, followed by global average pooling: Enc and GAP of Eq. (2).

    ``depth`` stages, stage i = Conv 3x3 (-> width * 2**i channels, padding 1) -> ReLU, with a 2x2 max-pooling
    between stages; then the spatial mean of each channel. No normalization layer: an instance norm would erase
    exactly the per-image channel statistics (the style) that tell sites apart, and a batch norm at its
    initialization is the identity.

    Initialization: PyTorch's default for convolutions (uniform in +-1/sqrt(fan_in), biases included), drawn from a
    CPU ``torch.Generator`` seeded with ``seed``: the same seed gives bit-identical weights on every machine with the
    same torch version, without touching the global RNG. The weights never train.

    Shapes: (N, in_channels, H, W) -> (N, out_features), out_features = width * 2**(depth - 1).
    """

    kind = "random"

    def __init__(self, in_channels: int, seed: int, width: int = 32, depth: int = 3):
        super().__init__()
        if in_channels < 1 or width < 1 or depth < 1:
            raise ValueError(f"in_channels, width and depth must be >= 1, got {in_channels}, {width}, {depth}")
        self.in_channels, self.seed, self.width, self.depth = int(in_channels), int(seed), int(width), int(depth)
        layers: list[nn.Module] = []
        c = in_channels
        with torch.random.fork_rng(devices=[]):  # the layers' own initialization must not advance the global RNG
            for i in range(depth):
                if i:
                    layers.append(nn.MaxPool2d(2))
                layers += [nn.Conv2d(c, width * 2**i, kernel_size=3, padding=1), nn.ReLU()]
                c = width * 2**i
        self.features = nn.Sequential(*layers)
        self.out_features = c
        default_init(self, seeded_generator(seed))
        self.requires_grad_(False)
        self.eval()

    def hparams(self) -> dict[str, int]:
        return {"in_channels": self.in_channels, "seed": self.seed, "width": self.width, "depth": self.depth}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x).mean(dim=(2, 3))


def build_feature_encoder(in_channels: int, seed: int, width: int = 32, depth: int = 3) -> RandomEncoder:
    """The shared random encoder every site rebuilds from ``seed`` (see :class:`RandomEncoder`)."""
    return RandomEncoder(in_channels, seed, width=width, depth=depth)


class GlobalModelEncoder(nn.Module):
    """The encoder of a FedDGUNet (``conv_0``, ``down_1`` .. ``down_4``, deep copies, frozen) followed by global
    average pooling: the option "final global model's encoder" for Eq. (2).

    The state dict's keys are the FedDGUNet's own (``conv_0.*``, ``down_1.*`` ...), so the encoder of a saved model
    can be loaded from that model's state dict filtered to these prefixes. Evaluation mode throughout: BatchNorm
    uses its running statistics, so a vector does not depend on the other images of the batch.

    Shapes: (N, in_channels, H, W) -> (N, features[4]).
    """

    kind = "global_model"
    BLOCKS = ("conv_0", "down_1", "down_2", "down_3", "down_4")

    def __init__(self, model: nn.Module):
        super().__init__()
        for name in self.BLOCKS:
            self.add_module(name, copy.deepcopy(getattr(model, name)))
        first_conv = next(m for m in self.conv_0.modules() if isinstance(m, nn.Conv2d))
        last_conv = [m for m in self.down_4.modules() if isinstance(m, nn.Conv2d)][-1]
        self.in_channels = first_conv.in_channels
        self.out_features = last_conv.out_channels
        self.requires_grad_(False)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.BLOCKS:
            x = getattr(self, name)(x)
        return x.mean(dim=(2, 3))


def global_model_encoder(model: nn.Module) -> GlobalModelEncoder:
    """The encoder of a FedDGUNet (typically the final global model) + GAP, as a frozen copy."""
    return GlobalModelEncoder(model)


def encode(encoder: nn.Module, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Eq. (2) for a stack of preprocessed images (as the network receives them).

    Args:
        encoder: a :class:`RandomEncoder` or :class:`GlobalModelEncoder` (any module mapping (B, C, H, W) to (B, F)).
        images: (N, C, H, W) array; N may be 0.
        batch_size: images per forward pass (the encoder runs in evaluation mode, so the result does not depend on
            it beyond float rounding).

    Returns:
        (N, F) float32 feature vectors.
    """
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"expected images of shape (N, C, H, W), got {images.shape}")
    in_channels = getattr(encoder, "in_channels", None)
    if in_channels is not None and images.shape[1] != in_channels:
        raise ValueError(f"the encoder takes {in_channels} channel(s), the images have {images.shape[1]}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    width = getattr(encoder, "out_features", None)
    param = next(iter(encoder.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    was_training = encoder.training
    encoder.eval()
    out = []
    try:
        with torch.no_grad():
            for start in range(0, images.shape[0], batch_size):
                x = torch.from_numpy(np.ascontiguousarray(images[start : start + batch_size], dtype=np.float32))
                out.append(encoder(x.to(device)).float().cpu().numpy())
    finally:
        encoder.train(was_training)
    if not out:
        return np.zeros((0, width or 0), np.float32)
    return np.concatenate(out).astype(np.float32, copy=False)
