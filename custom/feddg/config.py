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
class FedDGConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

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


_SECTIONS = {c.__name__: c for c in (SyntheticConfig, DataConfig, ModelConfig, TrainConfig, EvalConfig)}


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
    t = cfg.train
    if t.rounds < 1 or t.local_epochs < 1 or t.batch_size < 1:
        raise ConfigError("train.rounds, train.local_epochs and train.batch_size must be >= 1")
    if t.local_steps is not None and t.local_steps < 1:
        raise ConfigError(f"train.local_steps: must be >= 1 or null, got {t.local_steps}")
    if t.min_sites is not None and not 1 <= t.min_sites <= len(d.train_sites):
        raise ConfigError(f"train.min_sites: must be between 1 and {len(d.train_sites)}, got {t.min_sites}")
    return cfg


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
