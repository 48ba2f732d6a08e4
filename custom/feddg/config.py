"""The experiment configuration: one YAML file per job, read by the server and by every site.

A job folder carries a single ``feddg.yaml`` next to its NVFlare configs. The server reads it to know which
sites train and which one is held out; each site reads it to know its data layout, preprocessing and local
training settings. Keeping both sides on one file is what makes "which site is unseen" a single choice.

Unknown keys are errors (a typo must not silently fall back to a default), and every error names the field.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TASKS = {
    # task -> (input channels, structure names). Fundus: disc is the union of rim and cup (multi-label).
    "prostate": (1, ("prostate",)),
    "fundus": (3, ("disc", "cup")),
}
LAYOUTS = ("saml_nifti", "slice_png", "dofe_png")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message names the field."""


@dataclass
class SyntheticConfig:
    """Size of the embedded synthetic multi-site data set (generated on first use, then cached)."""

    seed: int = 0
    cases_per_site: int = 8  # prostate: volumes per site; fundus: images per site (train + test)
    slices_per_case: int = 12  # prostate only
    size: int = 96  # in-plane size written to disk (px)


@dataclass
class DataConfig:
    """Where a task's data lives and how it is turned into 2D training samples."""

    task: str = "prostate"
    layout: str = "saml_nifti"
    root: str | None = None  # None: the synthetic default, generated into the cache on first use
    sites: list[str] = field(default_factory=lambda: ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"])
    unseen_site: str = "RUNMC"
    image_size: int = 64  # network input size (square); the papers use 384
    val_fraction: float = 0.2  # case-level share of a training site's train data held out for validation
    split_seed: int = 0
    zscore: str = "volume"  # MRI intensity normalisation: "volume" (per case) or "slice"
    train_empty_slices: bool = False  # train on slices without foreground (evaluation always uses all)
    cache_dir: str | None = None  # default: $FEDDG_CACHE or ~/.cache/feddg
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    @property
    def train_sites(self) -> list[str]:
        return [s for s in self.sites if s != self.unseen_site]

    @property
    def in_channels(self) -> int:
        return TASKS[self.task][0]

    @property
    def label_names(self) -> tuple[str, ...]:
        return TASKS[self.task][1]

    def resolved_cache_dir(self) -> Path:
        base = self.cache_dir or os.environ.get("FEDDG_CACHE") or Path.home() / ".cache" / "feddg"
        return Path(base).expanduser()


@dataclass
class ModelConfig:
    """The 2D U-Net (MONAI BasicUNet): six feature widths, as BasicUNet takes them."""

    features: list[int] = field(default_factory=lambda: [16, 16, 32, 64, 128, 16])
    norm: str = "batch"  # "batch" or "instance", as MONAI names them
    dropout: float = 0.0
    bin_levels: int = 0  # BIN-Net (MLA-BIN): BIN blocks in the top n encoder levels, 0-5 (the paper uses 3)


@dataclass
class TrainConfig:
    """Federated and local training settings."""

    rounds: int = 5
    local_epochs: int = 1
    local_steps: int | None = None  # optimizer steps per round instead of whole epochs (the gradient-alignment
    # paper runs 1); None trains ``local_epochs`` epochs
    batch_size: int = 8
    lr: float = 1e-3
    fedprox_mu: float = 0.0  # > 0 adds FedProx's proximal term to the local loss
    augment: bool = True
    seed: int = 0
    min_sites: int | None = None  # minimum training sites per round; None: all training sites
    task_timeout: int = 3600  # seconds a round waits for the sites before going on with those that answered


@dataclass
class EvalConfig:
    """How the global model is scored."""

    largest_component: bool = False  # keep only the largest connected component of each structure
    batch_size: int = 16


@dataclass
class ELCFSConfig:
    """ELCFS (Liu et al., CVPR 2021): the amplitude exchange and the boundary-oriented episodic learning.
    Only ELCFS jobs read this section."""

    alpha: float = 0.01  # window M = [-alpha H : alpha H, -alpha W : alpha W] of the centred amplitude spectrum
    min_half_width: int = 1  # floor of b = floor(alpha H): below 100 px alpha = 0.01 would keep the DC alone
    bank_images: int | None = None  # images a site contributes to the amplitude bank; None: all training images
    transforms_per_image: int | None = None  # n_t meta-test images per image; None: K - 1, one per other site
    lam_range: list[float] = field(default_factory=lambda: [0.0, 1.0])  # interpolation ratio lambda ~ U(range)
    meta_step_size: float = 1e-3  # beta, the inner step of Eq. (4)
    boundary_weight: float = 0.5  # gamma of Eq. (8): 0.5 prostate, 0.1 fundus in the paper
    temperature: float = 0.05  # tau of Eq. (6)
    contrast_denominator: str = "all"  # Eq. (6): "negatives" as printed, or "all" as in the cited SimCLR InfoNCE
    # (measured: the printed form drowns the Dice loss; see feddg/methods/boundary.py)
    dilation_iterations: int = 5  # width of the background ring around the anatomy
    second_order: bool = False  # back-propagate through the inner step (the authors' code is first order)


MLA_ENCODERS = ("random", "global")
MLA_MODES = ("mean", "per_image")


@dataclass
class MLAConfig:
    """MLA (MLA-BIN, section 2.2): the feature bank after training, the domain attention module (DAM) and the
    attention-weighted combination of the sites' local models. Only MLA jobs read this section; the BIN-Net half
    of MLA-BIN is ``model.bin_levels``."""

    encoder: str = "random"  # the shared feature encoder of Eq. (2): "random" (a CNN drawn from encoder_seed,
    # rebuilt at every site from the seed alone) or "global" (the final global model's encoder)
    encoder_seed: int = 0
    encoder_width: int = 32  # random encoder: channels of its first stage, doubled per stage
    encoder_depth: int = 3  # random encoder: stages; its features = encoder_width * 2 ** (encoder_depth - 1)
    feature_images: int | None = None  # training images per site mapped to feature vectors (a seeded random
    # subset); None: all of them
    attention_epochs: int = 100  # section 3.2: 100 epochs, lr 1e-3, batch 8
    attention_lr: float = 1e-3
    attention_batch_size: int = 8
    attention_seed: int = 0  # the DAM's initialization and shuffling
    attention_conv_channels: int = 128  # widths of the DAM (the paper gives none)
    attention_hidden: int = 64
    attention_mode: str = "mean"  # "mean": one combined model per site from the mean per-image softmax;
    # "per_image": one combined model per image


@dataclass
class FedDGConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    elcfs: ELCFSConfig = field(default_factory=ELCFSConfig)
    mla: MLAConfig = field(default_factory=MLAConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _build(cls: type, values: Any, where: str):
    if values is None:
        return cls()
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(values).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known keys are {sorted(known)}")
    kwargs = {}
    for name, value in values.items():
        nested = _SECTIONS.get(str(known[name].type))
        kwargs[name] = _build(nested, value, f"{where}.{name}") if nested else value
    return cls(**kwargs)


_SECTIONS = {c.__name__: c for c in (SyntheticConfig, DataConfig, ModelConfig, TrainConfig, EvalConfig, ELCFSConfig,
                                               MLAConfig)}


def validate(cfg: FedDGConfig) -> FedDGConfig:
    d = cfg.data
    if d.task not in TASKS:
        raise ConfigError(f"data.task: unknown task {d.task!r}; choose one of {sorted(TASKS)}")
    if d.layout not in LAYOUTS:
        raise ConfigError(f"data.layout: unknown layout {d.layout!r}; choose one of {list(LAYOUTS)}")
    if len(set(d.sites)) != len(d.sites) or not d.sites:
        raise ConfigError(f"data.sites: must be a non-empty list of distinct names, got {d.sites}")
    if d.unseen_site not in d.sites:
        raise ConfigError(f"data.unseen_site: {d.unseen_site!r} is not one of data.sites {d.sites}")
    if not 0.0 <= d.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction: must be in [0, 1), got {d.val_fraction}")
    if d.zscore not in ("volume", "slice"):
        raise ConfigError(f"data.zscore: must be 'volume' or 'slice', got {d.zscore!r}")
    if d.image_size < 16 or d.image_size % 16:
        raise ConfigError(f"data.image_size: must be a multiple of 16 (four poolings), got {d.image_size}")
    if len(cfg.model.features) != 6:
        raise ConfigError(f"model.features: BasicUNet takes 6 widths, got {cfg.model.features}")
    bl = cfg.model.bin_levels
    if isinstance(bl, bool) or not isinstance(bl, int) or not 0 <= bl <= 5:
        raise ConfigError(f"model.bin_levels: must be an integer from 0 to 5 (encoder levels), got {bl!r}")
    t = cfg.train
    if t.rounds < 1 or t.local_epochs < 1 or t.batch_size < 1:
        raise ConfigError("train.rounds, train.local_epochs and train.batch_size must be >= 1")
    if t.local_steps is not None and t.local_steps < 1:
        raise ConfigError(f"train.local_steps: must be >= 1 or null, got {t.local_steps}")
    if t.min_sites is not None and not 1 <= t.min_sites <= len(d.train_sites):
        raise ConfigError(f"train.min_sites: must be between 1 and {len(d.train_sites)}, got {t.min_sites}")
    _validate_elcfs(cfg.elcfs, len(d.train_sites))
    _validate_mla(cfg.mla)
    return cfg


def _validate_elcfs(e: ELCFSConfig, n_train_sites: int) -> None:
    if e.alpha < 0 or e.min_half_width < 0:
        raise ConfigError(f"elcfs.alpha and elcfs.min_half_width must be >= 0, got {e.alpha}, {e.min_half_width}")
    if e.bank_images is not None and e.bank_images < 1:
        raise ConfigError(f"elcfs.bank_images: must be >= 1 or null, got {e.bank_images}")
    if e.transforms_per_image is not None and not 1 <= e.transforms_per_image <= max(n_train_sites - 1, 1):
        raise ConfigError(f"elcfs.transforms_per_image: must be between 1 and {n_train_sites - 1} (the other "
                          f"training sites) or null, got {e.transforms_per_image}")
    if len(e.lam_range) != 2 or not 0.0 <= e.lam_range[0] <= e.lam_range[1] <= 1.0:
        raise ConfigError(f"elcfs.lam_range: must be [low, high] with 0 <= low <= high <= 1, got {e.lam_range}")
    if e.contrast_denominator not in ("negatives", "all"):
        raise ConfigError(f"elcfs.contrast_denominator: must be 'negatives' or 'all', got {e.contrast_denominator!r}")
    if e.meta_step_size < 0 or e.boundary_weight < 0 or e.temperature <= 0 or e.dilation_iterations < 1:
        raise ConfigError("elcfs.meta_step_size and elcfs.boundary_weight must be >= 0, elcfs.temperature > 0 "
                          "and elcfs.dilation_iterations >= 1")


def _validate_mla(m: MLAConfig) -> None:
    if m.encoder not in MLA_ENCODERS:
        raise ConfigError(f"mla.encoder: must be one of {list(MLA_ENCODERS)}, got {m.encoder!r}")
    if m.attention_mode not in MLA_MODES:
        raise ConfigError(f"mla.attention_mode: must be one of {list(MLA_MODES)}, got {m.attention_mode!r}")
    for name in ("encoder_seed", "attention_seed"):
        value = getattr(m, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"mla.{name}: must be a non-negative integer, got {value!r}")
    for name in ("encoder_width", "encoder_depth", "attention_epochs", "attention_batch_size",
                 "attention_conv_channels", "attention_hidden"):
        value = getattr(m, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"mla.{name}: must be an integer >= 1, got {value!r}")
    if m.feature_images is not None and (isinstance(m.feature_images, bool) or not isinstance(m.feature_images, int)
                                         or m.feature_images < 1):
        raise ConfigError(f"mla.feature_images: must be an integer >= 1 or null, got {m.feature_images!r}")
    if isinstance(m.attention_lr, bool) or not isinstance(m.attention_lr, (int, float)) or not m.attention_lr > 0:
        raise ConfigError(f"mla.attention_lr: must be a number > 0, got {m.attention_lr!r}")


def mla_feature_width(cfg: FedDGConfig) -> int:
    """The width of MLA's feature vectors (Eq. 2): the random encoder's last stage, or the deepest encoder level
    of the network for the global model's encoder."""
    if cfg.mla.encoder == "global":
        return int(cfg.model.features[4])
    return int(cfg.mla.encoder_width * 2 ** (cfg.mla.encoder_depth - 1))


def load_config(path: str | os.PathLike) -> FedDGConfig:
    """Read and validate a ``feddg.yaml``; errors name the file and the field."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the configuration: {e}") from e
    try:
        return validate(_build(FedDGConfig, raw, "config"))
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"{path}: {e}") from e


def config_from_dict(raw: dict[str, Any]) -> FedDGConfig:
    return validate(_build(FedDGConfig, raw, "config"))
