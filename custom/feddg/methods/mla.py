"""Model-level attention (MLA), MLA-BIN (Zhu et al.), section 2.2, Eq. (1)-(4), and section 3.2, Eq. (8).

Pure torch / numpy; no NVFlare. What runs where:

* each site maps its images to feature vectors with a shared encoder and global average pooling, Eq. (2)::

      C_n^t = GAP(Enc(x_n^t; theta_Enc))                          (:func:`encode`)

  and sends them to the server, which stacks them into the *domain feature bank*;
* the server trains the domain attention module (DAM) to tell which site a vector comes from, Eq. (3) and (8)::

      D^w = SM(FC_2(FC_1(Conv(C_n^t; theta_C); theta_FC1); theta_FC2))       (:class:`DomainAttention`)
      L_cls = - sum_i d_i log(d_i^p)                                        (:func:`train_domain_attention`)

* for images of an unseen domain, the DAM's output weights the sites' local models, Eq. (4)::

      G(m) = sum_i D_i^w l_i(m)                                   (:func:`attention_weights`, :func:`combine_state_dicts`)

Choices the paper leaves open (no public code exists):

* **Encoder.** The paper uses "a pre-trained CNN model with unified pre-training weights". Nothing can be downloaded
  here, so the default shared encoder is a small CNN with *random* weights drawn from a seed
  (:func:`build_feature_encoder`): every site rebuilds the identical network from the seed alone. Random convolution
  + ReLU + GAP features are statistics of local intensity patterns, which is what tells acquisition styles apart.
  The alternative is the encoder of the final global model (:func:`global_model_encoder`).
* **DAM sizes.** "A 1x1 convolutional layer and two fully connected layers": the feature vector (B, C) is viewed as
  (B, C, 1, 1); Conv 1x1 C -> ``conv_channels`` (128), ReLU, FC_1 -> ``hidden`` (64), ReLU, FC_2 -> K. The paper
  gives neither the widths nor the activations; "multilayer perceptron" implies non-linearities between layers
  (without them the three layers collapse to one linear map).
* **Input standardization.** Before the 1x1 convolution each feature is standardized with the mean and standard
  deviation of the training feature bank. They are buffers (part of the state dict, not trained), so the same
  transform is applied at application time. Random-encoder features have arbitrary scales; without this, Adam at
  the paper's learning rate of 1e-3 spends most of its 100 epochs on the scale.
* **Training.** Plain cross-entropy (Eq. 8), no class weighting (so a site with more images gets a larger prior,
  as in the paper), Adam with default betas, lr 1e-3, 100 epochs, batch size 8 ("the same settings as FL, except
  the learning rate ... and the epoch"); PyTorch's default initialization drawn from a local generator; the
  reported accuracy is on the training bank, after training.
* **Several images of the unseen domain.** The DAM is trained on single-image vectors, so it is applied to single
  images; the default ``"mean"`` mode averages the per-image *softmax outputs* (not the features) to get one weight
  vector for the domain. See :func:`attention_weights`.
* **Integer buffers** (BatchNorm's ``num_batches_tracked``) are combined with the same weights and rounded; boolean
  buffers are taken from the model with the largest weight. See :func:`combine_state_dicts`.
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

WEIGHT_SUM_TOLERANCE = 1e-5
MODES = ("mean", "per_image")


# ---------------------------------------------------------------------------------------------- Eq. (4)


def _label(i: int, labels: Sequence[str] | None) -> str:
    return f"model {i}" if labels is None else f"model {i} ({labels[i]})"


def check_state_dicts(states: Sequence[Mapping[str, torch.Tensor]], labels: Sequence[str] | None = None) -> None:
    """Raise ValueError unless every state dict has the keys, shapes and dtype kinds of the first one.

    The message names the first differing key (in model 0's key order, then in model i's) and the two models, by
    index and, when ``labels`` are given, by name.
    """
    if not states:
        raise ValueError("no state dicts to combine")
    if labels is not None and len(labels) != len(states):
        raise ValueError(f"{len(labels)} labels for {len(states)} state dicts")
    ref = states[0]
    for i in range(1, len(states)):
        other = states[i]
        missing = [k for k in ref if k not in other]
        if missing:
            raise ValueError(f"state dicts disagree in keys: {missing[0]!r} is in {_label(0, labels)} but not in "
                             f"{_label(i, labels)}")
        extra = [k for k in other if k not in ref]
        if extra:
            raise ValueError(f"state dicts disagree in keys: {extra[0]!r} is in {_label(i, labels)} but not in "
                             f"{_label(0, labels)}")
        for k, a in ref.items():
            b = other[k]
            if tuple(a.shape) != tuple(b.shape):
                raise ValueError(f"state dicts disagree in shapes: {k!r} is {tuple(a.shape)} in {_label(0, labels)} "
                                 f"but {tuple(b.shape)} in {_label(i, labels)}")
            if _kind(a) != _kind(b):
                raise ValueError(f"state dicts disagree in dtypes: {k!r} is {a.dtype} in {_label(0, labels)} "
                                 f"but {b.dtype} in {_label(i, labels)}")


def _kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    if t.is_floating_point() or t.is_complex():
        return "float"
    return "int"


def check_weights(weights: Sequence[float] | np.ndarray | torch.Tensor, n: int) -> np.ndarray:
    """The weights as a float64 array of length ``n``; ValueError unless they are finite, non-negative and sum to 1
    within ``WEIGHT_SUM_TOLERANCE``."""
    if isinstance(weights, torch.Tensor):
        w = weights.detach().cpu().to(torch.float64).numpy()
    else:
        w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.shape[0] != n:
        raise ValueError(f"expected {n} weights (one per model), got shape {tuple(w.shape)}")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"weights must be finite, got {w.tolist()}")
    if np.any(w < 0):
        raise ValueError(f"weights must be non-negative, got {w.tolist()}")
    if abs(w.sum() - 1.0) > WEIGHT_SUM_TOLERANCE:
        raise ValueError(f"weights must sum to 1 (within {WEIGHT_SUM_TOLERANCE}), got sum {w.sum():.8g}")
    return w


def combine_state_dicts(
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float] | np.ndarray | torch.Tensor,
    labels: Sequence[str] | None = None,
) -> dict[str, torch.Tensor]:
    """Eq. (4): G = sum_i D^w_i l_i, entry by entry over K state dicts.

    Args:
        states: K state dicts with identical keys and shapes (checked first, see :func:`check_state_dicts`).
        weights: K finite, non-negative weights summing to 1 (within ``WEIGHT_SUM_TOLERANCE``), e.g. the output of
            :func:`attention_weights` in ``"mean"`` mode.
        labels: optional K names (sites) used in error messages.

    Returns:
        A new state dict in model 0's key order, each entry a new tensor with model 0's dtype and device:

        * floating-point (and complex) entries: the weighted sum, accumulated in float64 (complex128) and cast back.
          Models with weight exactly 0 are skipped, so a one-hot weight vector returns that model's tensors exactly
          (bit for bit) and a zero-weight model's NaN/Inf cannot leak in (0 * inf is NaN).
        * integer entries (BatchNorm's ``num_batches_tracked``): the same weighted sum, rounded to the nearest
          integer. It equals the common value when all models agree and the chosen model's value for one-hot
          weights. (The counter only matters for BatchNorm with ``momentum=None``.)
        * boolean entries: copied from the model with the largest weight (the first one on ties).

    Raises:
        ValueError: keys, shapes or dtype kinds disagree (naming the first differing key and both models), or the
            weights are of the wrong length, negative, non-finite or do not sum to 1.
    """
    check_state_dicts(states, labels)
    w = check_weights(weights, len(states))
    used = [i for i in range(len(states)) if w[i] != 0.0]
    top = int(np.argmax(w))
    out: dict[str, torch.Tensor] = {}
    for key, ref in states[0].items():
        kind = _kind(ref)
        if kind == "bool":
            out[key] = states[top][key].detach().clone().to(ref.device)
            continue
        acc_dtype = torch.complex128 if ref.is_complex() else torch.float64
        acc = torch.zeros(ref.shape, dtype=acc_dtype, device=ref.device)
        for i in used:
            acc += float(w[i]) * states[i][key].detach().to(device=ref.device, dtype=acc_dtype)
        if kind == "int":
            acc = torch.round(acc)
        out[key] = acc.to(ref.dtype)
    return out


# ---------------------------------------------------------------------------------------------- feature checks


def check_feature_matrix(x: object, width: int | None = None, max_rows: int | None = None) -> None:
    """Raise ValueError naming the problem unless ``x`` is a 2-D floating-point numpy array of finite values with
    ``width`` columns (when given) and at most ``max_rows`` rows (when given). Zero rows are allowed (a site with no
    images); a site's feature upload is checked with this before it joins the bank."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"feature matrix: expected a numpy array, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"feature matrix: expected 2 dimensions (images, features), got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"feature matrix: expected a floating-point dtype, got {x.dtype}")
    finite = np.isfinite(x)
    if not finite.all():
        bad_rows = np.flatnonzero(~finite.all(axis=1))
        raise ValueError(f"feature matrix: {int((~finite).sum())} NaN/Inf value(s) in {bad_rows.size} row(s), "
                         f"first in row {int(bad_rows[0])}")
    if width is not None and x.shape[1] != width:
        raise ValueError(f"feature matrix: expected {width} features per image, got {x.shape[1]}")
    if max_rows is not None and x.shape[0] > max_rows:
        raise ValueError(f"feature matrix: {x.shape[0]} rows is more than the allowed {max_rows}")


# ---------------------------------------------------------------------------------------------- seeded init


@torch.no_grad()
def _default_init(module: nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default initialization of Conv / Linear layers (kaiming-uniform with a = sqrt(5), i.e. weights and
    biases uniform in +-1/sqrt(fan_in)), drawn from ``generator`` instead of the global RNG."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=generator)
            if m.bias is not None:
                bound = 1.0 / math.sqrt(nn.init._calculate_fan_in_and_fan_out(m.weight)[0])
                nn.init.uniform_(m.bias, -bound, bound, generator=generator)


@contextlib.contextmanager
def _single_thread() -> Iterator[None]:
    """Run torch on one intra-op thread, then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    return g


# ---------------------------------------------------------------------------------------------- Eq. (3)


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
        _default_init(self, _generator(seed))

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
) -> tuple[DomainAttention, list[str], float]:
    """Train the DAM on the domain feature bank with cross-entropy (Eq. 8) and Adam.

    Args:
        features: site -> (N_site, C) float feature vectors (:func:`encode`'s output). A site with no vectors
            (N_site = 0) is left out with a ``UserWarning`` naming it: it has no model to weight.
        epochs, lr, batch_size: the paper's 100, 1e-3 and 8.
        seed: seeds the initialization and the shuffling (local generators; the global RNG is not touched).
            Training runs on one CPU thread (the previous thread count is restored afterwards): the batches are
            far too small to gain from more, the results then do not depend on the machine's core count, and
            several threads on a busy machine spin-wait for each other (measured: 40x slower with 2 threads on 2
            busy cores). The same seed gives the same module on one machine; across CPUs with different
            vector instructions the last bits may still differ.
        conv_channels, hidden: the DAM's widths (:class:`DomainAttention`).

    Returns:
        (module in eval mode, site order, train accuracy). The site order lists only the sites used, in the
        mapping's order; the module's output i is site_order[i]. The accuracy is the share of bank vectors whose
        arg-max is their own site, after training.

    Raises:
        ValueError: a feature matrix fails :func:`check_feature_matrix` (the message names the site), widths
            differ between sites, no site has any vectors, or epochs / batch_size < 1.
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
    module.set_standardization(x)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    shuffle = _generator(seed + 1)
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


# ---------------------------------------------------------------------------------------------- Eq. (2)


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
        _default_init(self, _generator(seed))
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
