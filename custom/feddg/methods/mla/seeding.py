"""Seeded initialization for MLA-BIN (Zhu et al.), section 2.2: the random encoder of Eq. (2) and the domain
attention module of Eq. (3) draw their initial weights from a local ``torch.Generator``.

Every site rebuilds the identical random encoder from the seed alone, and neither network advances the global RNG
(which the sites' training uses).
"""

from __future__ import annotations

import math

import torch
from torch import nn


@torch.no_grad()
def default_init(module: nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default initialization of Conv / Linear layers (kaiming-uniform with a = sqrt(5), i.e. weights and
    biases uniform in +-1/sqrt(fan_in)), drawn from ``generator`` instead of the global RNG."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=generator)
            if m.bias is not None:
                bound = 1.0 / math.sqrt(nn.init._calculate_fan_in_and_fan_out(m.weight)[0])
                nn.init.uniform_(m.bias, -bound, bound, generator=generator)


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (the same draws on every machine with the same torch version)."""
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    return g
