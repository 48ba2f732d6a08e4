"""The domain attention module (DAM) of MLA-BIN (Zhu et al.), section 2.2, Eq. (3), trained with the cross-entropy
of section 3.2, Eq. (8), and its output D^w, the weights of Eq. (4)::

      D^w = SM(FC_2(FC_1(Conv(C_n^t; theta_C); theta_FC1); theta_FC2))       (:class:`DomainAttention`)
      L_cls = - sum_i d_i log(d_i^p)                                        (:func:`train_domain_attention`)

The server trains the DAM on the domain feature bank (the sites' vectors C_n^t of Eq. (2)) to tell which site a
vector comes from; for images of an unseen domain its output weights the sites' local models
(:func:`attention_weights`, then :func:`feddg.methods.mla.combination.combine_state_dicts`).

Choices the paper leaves open (no public code exists):

* **DAM sizes.** "A 1x1 convolutional layer and two fully connected layers": the feature vector (B, C) is viewed as
  (B, C, 1, 1); Conv 1x1 C -> ``conv_channels`` (128), ReLU, FC_1 -> ``hidden`` (64), ReLU, FC_2 -> K. The paper
  gives neither the widths nor the activations; "multilayer perceptron" implies non-linearities between layers
  (without them the three layers collapse to one linear map).
* **Input standardization** (an addition to Eq. 3). Before the 1x1 convolution each feature is standardized with
  the mean and standard deviation of the training feature bank. They are buffers (part of the state dict, not
  trained), so the same transform is applied at application time. Random-encoder features are small and unevenly
  scaled (synthetic prostate: per-feature standard deviations 0 to 0.02). Measured on a prostate MLA-BIN job's
  bundle, 5 seeds (``benchmarks/mla_standardization.py``, numbers in docs/methods.md): with it the module tells the
  sites apart after 5 epochs (accuracy 1.000; about 0.4 without), both forms reach 1.000 by 100 epochs, and they send
  the unseen site's weight to different sites, unseen Dice 0.551 with it against 0.529 without.
  ``train_domain_attention(..., standardize=False)`` gives Eq. 3 as printed.
* **Training.** Plain cross-entropy (Eq. 8), no class weighting (so a site with more images gets a larger prior,
  as in the paper), Adam with default betas, lr 1e-3, 100 epochs, batch size 8 ("the same settings as FL, except
  the learning rate ... and the epoch"); PyTorch's default initialization drawn from a local generator; the
  reported accuracy is on the training bank, after training.
* **Several images of the unseen domain.** The DAM is trained on single-image vectors, so it is applied to single
  images; the default ``"mean"`` mode averages the per-image *softmax outputs* (not the features) to get one weight
  vector for the domain. See :func:`attention_weights`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping

import numpy as np
import torch
from torch import nn

from feddg.methods.mla.features import check_feature_matrix
from feddg.methods.mla.seeding import default_init, seeded_generator

MODES = ("mean", "per_image")


@contextlib.contextmanager
def _single_thread() -> Iterator[None]:
    """Run torch on one intra-op thread, then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class DomainAttention(nn.Module):
    """The domain attention module (DAM), Eq. (3): 1x1 conv -> FC_1 -> FC_2, softmax over the K training sites.

    Layers: feature standardization (buffers ``feature_mean``, ``feature_std``; identity until
    :meth:`set_standardization`), ``conv`` 1x1 (C -> conv_channels), ReLU, ``fc1`` (conv_channels -> hidden), ReLU,
    ``fc2`` (hidden -> K). Widths and activations are this implementation's choice (see the module docstring).

    Args:
        in_features: C, the width of the feature vectors.
        num_sites: K.
        conv_channels: output channels of the 1x1 convolution.
        hidden: width of FC_1.
        seed: the initialization is drawn from a generator seeded with this (the global RNG is not touched).

    Shapes: :meth:`forward` takes (B, C) or (B, C, 1, 1) and returns logits (B, K); :meth:`probabilities` returns
    the softmax D^w (B, K), rows summing to 1.
    """

    def __init__(self, in_features: int, num_sites: int, conv_channels: int = 128, hidden: int = 64, seed: int = 0):
        super().__init__()
        if in_features < 1 or num_sites < 1 or conv_channels < 1 or hidden < 1:
            raise ValueError(f"DomainAttention sizes must be >= 1, got in_features={in_features}, "
                             f"num_sites={num_sites}, conv_channels={conv_channels}, hidden={hidden}")
        self.in_features = int(in_features)
        self.num_sites = int(num_sites)
        self.conv_channels = int(conv_channels)
        self.hidden = int(hidden)
        self.register_buffer("feature_mean", torch.zeros(in_features))
        self.register_buffer("feature_std", torch.ones(in_features))
        with torch.random.fork_rng(devices=[]):  # the layers' own initialization must not advance the global RNG
            self.conv = nn.Conv2d(in_features, conv_channels, kernel_size=1)
            self.fc1 = nn.Linear(conv_channels, hidden)
            self.fc2 = nn.Linear(hidden, num_sites)
        default_init(self, seeded_generator(seed))

    def hparams(self) -> dict[str, int]:
        """What the constructor needs to rebuild this module (the state dict holds the rest)."""
        return {"in_features": self.in_features, "num_sites": self.num_sites, "conv_channels": self.conv_channels,
                "hidden": self.hidden}

    @torch.no_grad()
    def set_standardization(self, features: torch.Tensor) -> None:
        """Set the standardization buffers to the per-feature mean and standard deviation of ``features`` (N, C);
        a (near-)constant feature gets std 1 so that it is only centred."""
        mean = features.mean(dim=0)
        std = features.std(dim=0, correction=0) if features.shape[0] > 1 else torch.ones_like(mean)
        std = torch.where(std > 1e-6 * (1.0 + mean.abs()), std, torch.ones_like(std))
        self.feature_mean.copy_(mean)
        self.feature_std.copy_(std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4:
            x = x.flatten(1)
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"DomainAttention expects (B, {self.in_features}) or (B, {self.in_features}, 1, 1), "
                             f"got {tuple(x.shape)}")
        x = (x - self.feature_mean) / self.feature_std
        x = torch.relu(self.conv(x[:, :, None, None])).flatten(1)
        x = torch.relu(self.fc1(x))
        return self.fc2(x)

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """D^w = softmax(logits), (B, K)."""
        return torch.softmax(self.forward(x), dim=1)


def train_domain_attention(
    features: Mapping[str, np.ndarray],
    epochs: int = 100,
    lr: float = 1e-3,
    seed: int = 0,
    batch_size: int = 8,
    conv_channels: int = 128,
    hidden: int = 64,
    standardize: bool = True,
) -> tuple[DomainAttention, list[str], float]:
    """Train the DAM on the domain feature bank with cross-entropy (Eq. 8) and Adam.

    Args:
        features: site -> (N_site, C) float feature vectors (:func:`feddg.methods.mla.encoders.encode`'s output).
            A site with no vectors (N_site = 0) is left out with a ``UserWarning`` naming it: it has no model to
            weight.
        epochs, lr, batch_size: the paper's 100, 1e-3 and 8.
        seed: seeds the initialization and the shuffling (local generators; the global RNG is not touched).
            Training runs on one CPU thread (the previous thread count is restored afterwards): the batches are
            far too small to gain from more, the results then do not depend on the machine's core count, and
            several threads on a busy machine spin-wait for each other (measured: 40x slower with 2 threads on 2
            busy cores). The same seed gives the same module on one machine; across CPUs with different
            vector instructions the last bits may still differ.
        conv_channels, hidden: the DAM's widths (:class:`DomainAttention`).
        standardize: standardize the features with the bank's statistics first (this module's choice, see the
            module docstring); False keeps Eq. (3) as printed, for the measurement that justified the choice
            (``benchmarks/mla_standardization.py``).

    Returns:
        (module in eval mode, site order, train accuracy). The site order lists only the sites used, in the
        mapping's order; the module's output i is site_order[i]. The accuracy is the share of bank vectors whose
        arg-max is their own site, after training.

    Raises:
        ValueError: a feature matrix fails :func:`~feddg.methods.mla.features.check_feature_matrix` (the message
            names the site), widths differ between sites, no site has any vectors, or epochs / batch_size < 1.
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
    width = None
    used: list[str] = []
    skipped: list[str] = []
    for site, x in features.items():
        try:
            check_feature_matrix(x, width)
        except ValueError as e:
            raise ValueError(f"site {site!r}: {e}") from None
        if x.shape[0] == 0:
            skipped.append(site)
            continue
        width = x.shape[1]
        used.append(site)
    if skipped:
        warnings.warn(f"MLA: site(s) {skipped} sent no feature vectors and are left out of the domain attention",
                      stacklevel=2)
    if not used:
        raise ValueError("MLA: no site has any feature vectors to train the domain attention on")
    x = torch.from_numpy(np.concatenate([np.asarray(features[s], np.float32) for s in used]))
    y = torch.cat([torch.full((features[s].shape[0],), i, dtype=torch.long) for i, s in enumerate(used)])

    module = DomainAttention(x.shape[1], len(used), conv_channels=conv_channels, hidden=hidden, seed=seed)
    if standardize:
        module.set_standardization(x)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    shuffle = seeded_generator(seed + 1)
    module.train()
    with _single_thread():
        for _ in range(epochs):
            order = torch.randperm(x.shape[0], generator=shuffle)
            for start in range(0, x.shape[0], batch_size):
                idx = order[start : start + batch_size]
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(module(x[idx]), y[idx])
                loss.backward()
                optimizer.step()
        module.eval()
        with torch.no_grad():
            accuracy = float((module(x).argmax(dim=1) == y).float().mean())
    return module, used, accuracy


def site_accuracy(module: DomainAttention, features: Mapping[str, np.ndarray], order: list[str]) -> dict[str, float]:
    """Per site of ``order`` (the module's output order): the share of its (N_site, C) vectors in ``features`` whose
    largest output is that site."""
    out = {}
    with torch.no_grad():
        for i, site in enumerate(order):
            pred = module(torch.from_numpy(np.asarray(features[site], np.float32))).argmax(dim=1)
            out[site] = float((pred == i).float().mean())
    return out


def attention_weights(
    module: DomainAttention, features: torch.Tensor | np.ndarray, mode: str = "mean"
) -> torch.Tensor:
    """The DAM's weights D^w for the images of an unseen domain.

    Args:
        module: a trained :class:`DomainAttention`.
        features: (N, C) feature vectors of N >= 1 images, from the same encoder as the bank.
        mode: ``"mean"`` (default): the mean over the N images of the per-image softmax, shape (K,): one weight
            vector, hence one combined model, for the domain. ``"per_image"``: the softmax of each image, (N, K).

    Why the mean of the softmax outputs and not the softmax of the mean feature: the paper trains the DAM on single
    images' vectors C_n^t (Eq. 2-3) and applies it to "the data from the unseen domain" mapped the same way, so each
    image gets its D^w; one global model for the domain (Eq. 4) then needs one vector, and the average of the
    per-image probabilities is that image-level prediction averaged over the domain. An averaged feature vector is
    not the vector of any image (the encoder is non-linear) and lies off the distribution the DAM was trained on.
    The mean of probability vectors is still non-negative and sums to 1.

    Returns:
        float64 tensor, (K,) or (N, K), on the CPU.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if isinstance(features, np.ndarray):
        check_feature_matrix(features, module.in_features)
        features = torch.from_numpy(np.asarray(features, np.float32))
    if features.dim() != 2 or features.shape[1] != module.in_features:
        raise ValueError(f"expected features of shape (N, {module.in_features}), got {tuple(features.shape)}")
    if features.shape[0] == 0:
        raise ValueError("no feature vectors: the unseen domain needs at least one image")
    device = module.feature_mean.device
    with torch.no_grad():
        logits = module(features.to(device=device, dtype=torch.float32))
        p = torch.softmax(logits.to(torch.float64), dim=1).cpu()
    return p.mean(dim=0) if mode == "mean" else p
