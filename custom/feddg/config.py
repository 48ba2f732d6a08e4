"""The experiment configuration: one YAML file per job, read by the server and by every site.

A job folder carries a single ``feddg.yaml`` next to its NVFlare configs. The server reads it to know which
sites train and which one is held out; each site reads it to know its data layout, preprocessing and local
training settings. Keeping both sides on one file is what makes "which site is unseen" a single choice.

The schema is strict (pydantic v2 models in strict mode), because a value that is accepted in the wrong form
trains the wrong experiment without a word: ``augment: "false"`` is a string, not false; ``sites: RUNMC`` is not
a list; ``image_size: 64.0`` is not an integer; an unknown key is a typo, never ignored. Every error names the
file, the field path (``train.lr``) and the value. The YAML reader refuses a repeated key (PyYAML would keep the
last one silently) and reads ``1e-3`` as the float it means (YAML 1.1, which PyYAML follows, reads it as a
string). A file must name at least ``data.task`` and ``data.root`` (``null`` for the synthetic default): an
empty file or an empty ``data:`` section is an error, not the synthetic prostate data.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

TASKS = {
    # task -> (input channels, structure names). Fundus: disc is the union of rim and cup (multi-label).
    "prostate": (1, ("prostate",)),
    "fundus": (3, ("disc", "cup")),
}
# layout -> the task whose labels its masks encode (feddg.data.layouts describes each layout).
LAYOUT_TASKS = {"saml_nifti": "prostate", "slice_png": "prostate", "dofe_png": "fundus"}
LAYOUTS = tuple(LAYOUT_TASKS)

Task = Literal["prostate", "fundus"]
Layout = Literal["saml_nifti", "slice_png", "dofe_png"]
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
SiteName = Annotated[str, Field(min_length=1, pattern=r"^[^/\\\s][^/\\]*$")]  # a folder name under data.root


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range; the message names the file
    (when there is one), the field path and the value."""


class _Section(BaseModel):
    """Strict: no coercion between types (an int is accepted where a float is meant), unknown keys refused, no
    NaN/Inf."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class SyntheticConfig(_Section):
    """Size of the embedded synthetic multi-site data set and how its sites differ (generated on first use, then
    cached)."""

    seed: NonNegativeInt = 0
    cases_per_site: PositiveInt = 8  # prostate: volumes per site; fundus: images per site (train + test)
    slices_per_case: PositiveInt = 12  # prostate only
    size: PositiveInt = 96  # in-plane size written to disk (px)
    held_out_cases: PositiveInt | None = None  # cases of the unseen site instead of cases_per_site (more test
    # cases narrow the intervals of a comparison and cost evaluation only); None: cases_per_site. Case i of a site
    # is the same whatever the count, so the training sites' data does not depend on this setting.
    shift: Literal["style_and_content", "style_only"] = "style_and_content"  # how the sites differ.
    # "style_and_content": each site has its own acquisition style (intensity curve, bias field, noise, blur,
    # resolution, field of view, colour cast) AND its own anatomy and labelling convention (prostate: gland size,
    # shape, mask margin, smoothed or jagged outline, unlabelled apex/base slices; fundus: disc size and shape,
    # cup-to-disc ratio, disc and cup margins, smoothed contours): a shift that exchanging image styles (e.g. the
    # amplitude spectra of ELCFS) does not undo.
    # "style_only": the same anatomy and labelling distribution at every site, sites differ by style alone.
    # The tables are in feddg.data.synthetic.prostate and .fundus.


class DataConfig(_Section):
    """Where a task's data lives and how it is turned into 2D training samples."""

    task: Task = "prostate"
    layout: Layout = "saml_nifti"
    root: str | None = None  # None: the synthetic default, generated into the cache on first use
    sites: list[SiteName] = Field(default_factory=lambda: ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"])
    unseen_site: SiteName = "RUNMC"
    image_size: PositiveInt = 64  # network input size (square, a multiple of 16); the papers use 384
    val_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.2  # case-level share of a training site's train data
    # held out for validation
    split_seed: NonNegativeInt = 0
    zscore: Literal["volume", "slice"] = "volume"  # MRI intensity normalisation: per case or per slice
    train_empty_slices: bool = False  # train on slices without foreground (evaluation always uses all)
    cache_dir: str | None = None  # default: $FEDDG_CACHE or ~/.cache/feddg
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)

    @property
    def train_sites(self) -> list[str]:
        return [s for s in self.sites if s != self.unseen_site]

    @property
    def in_channels(self) -> int:
        return TASKS[self.task][0]

    def role(self, site: str) -> Literal["unseen", "train"]:
        """A site's role in the job: the held-out ``unseen`` site never trains and only evaluates."""
        return "unseen" if site == self.unseen_site else "train"

    @property
    def label_names(self) -> tuple[str, ...]:
        return TASKS[self.task][1]

    def resolved_cache_dir(self) -> Path:
        base = self.cache_dir or os.environ.get("FEDDG_CACHE") or Path.home() / ".cache" / "feddg"
        return Path(base).expanduser()


class ModelConfig(_Section):
    """The 2D U-Net (MONAI BasicUNet): six feature widths, as BasicUNet takes them."""

    features: Annotated[list[PositiveInt], Field(min_length=6, max_length=6)] = Field(
        default_factory=lambda: [16, 16, 32, 64, 128, 16])
    norm: Literal["batch", "instance"] = "batch"  # as MONAI names them
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    bin_levels: Annotated[int, Field(ge=0, le=5)] = 0  # BIN-Net (MLA-BIN): BIN blocks in the top n encoder
    # levels, 0-5 (the paper uses 3)


class TrainConfig(_Section):
    """Federated and local training settings."""

    rounds: PositiveInt = 5
    local_epochs: PositiveInt = 1
    local_steps: PositiveInt | None = None  # optimizer steps per round instead of whole epochs (the
    # gradient-alignment paper runs 1); None trains ``local_epochs`` epochs
    batch_size: PositiveInt = 8
    lr: PositiveFloat = 1e-3
    fedprox_mu: NonNegativeFloat = 0.0  # > 0 adds FedProx's proximal term to the local loss
    augment: bool = True
    seed: NonNegativeInt = 0
    min_sites: PositiveInt | None = None  # minimum training sites per round; None: all training sites
    task_timeout: PositiveInt = 3600  # seconds a round waits for the sites before going on with those that answered
    amp: Literal["auto", "bf16", "fp16", "off"] = "auto"  # mixed precision of the sites' training
    # (feddg.precision): auto = bf16 on CUDA, float32 on the CPU


class EvalConfig(_Section):
    """How the global model is scored."""

    largest_component: bool = False  # keep only the largest connected component of each structure
    batch_size: PositiveInt = 16
    timeout: PositiveInt | None = None  # seconds the final evaluation waits for the sites; None: train.task_timeout


class GAConfig(_Section):
    """FedDG-GA (Zhang et al., CVPR 2023): generalization adjustment of the aggregation weights. Only GA jobs read
    this section."""

    step_size: Annotated[float, Field(ge=0, lt=1)] = 0.05  # d of Eq. (3); round r moves the weights by
    # d_r = (1 - r / R) d. 0 keeps the uniform weights a_i = 1/M: the paper's Table 3 control ("step 0")


class GradAlignConfig(_Section):
    """Gradient alignment of the sites' weight differences (Algorithm 1). Only gradient-alignment jobs read this
    section; the random order in which each site visits the others is drawn from ``train.seed`` and the round."""

    lam: Annotated[float, Field(gt=0, le=0.5)] = 0.1  # lambda of Eq. (5)
    average_norm_stats: bool = True  # average normalization running statistics plainly instead of aligning them


class ELCFSConfig(_Section):
    """ELCFS (Liu et al., CVPR 2021): the amplitude exchange and the boundary-oriented episodic learning.
    Only ELCFS jobs read this section."""

    alpha: Annotated[float, Field(ge=0, le=0.5)] = 0.01  # window M = [-alpha H : alpha H, -alpha W : alpha W] of
    # the centred amplitude spectrum
    min_half_width: NonNegativeInt = 1  # floor of b = floor(alpha H): below 100 px alpha = 0.01 would keep the DC
    bank_images: PositiveInt | None = None  # images a site contributes to the amplitude bank; None: all
    transforms_per_image: PositiveInt | None = None  # n_t meta-test images per image; None: K - 1, one per other site
    lam_range: Annotated[list[Annotated[float, Field(ge=0, le=1)]], Field(min_length=2, max_length=2)] = Field(
        default_factory=lambda: [0.0, 1.0])  # interpolation ratio lambda ~ U(range)
    meta_step_size: NonNegativeFloat = 1e-3  # beta, the inner step of Eq. (4)
    boundary_weight: NonNegativeFloat = 0.5  # gamma of Eq. (8): 0.5 prostate, 0.1 fundus in the paper
    temperature: PositiveFloat = 0.05  # tau of Eq. (6)
    contrast_denominator: Literal["negatives", "all"] = "all"  # Eq. (6): "negatives" as printed, or "all" as in
    # the cited SimCLR InfoNCE (measured: the printed form drowns the Dice loss; see feddg/methods/boundary.py)
    dilation_iterations: PositiveInt = 5  # width of the background ring around the anatomy
    second_order: bool = False  # back-propagate through the inner step (the authors' code is first order)
    exchange_timeout: PositiveInt = 600  # seconds each step of the amplitude exchange waits for the sites


MLA_ENCODERS = ("random", "global")
MLA_MODES = ("mean", "per_image")


class MLAConfig(_Section):
    """MLA (MLA-BIN, section 2.2): the feature bank after training, the domain attention module (DAM) and the
    attention-weighted combination of the sites' local models. Only MLA jobs read this section; the BIN-Net half
    of MLA-BIN is ``model.bin_levels``."""

    encoder: Literal["random", "global"] = "random"  # the shared feature encoder of Eq. (2): "random" (a CNN
    # drawn from encoder_seed, rebuilt at every site from the seed alone) or "global" (the final global model's
    # encoder)
    encoder_seed: NonNegativeInt = 0
    encoder_width: PositiveInt = 32  # random encoder: channels of its first stage, doubled per stage
    encoder_depth: PositiveInt = 3  # random encoder: stages; its features = encoder_width * 2 ** (encoder_depth - 1)
    feature_images: PositiveInt | None = None  # training images per site mapped to feature vectors (a seeded
    # random subset); None: all of them
    attention_epochs: PositiveInt = 100  # section 3.2: 100 epochs, lr 1e-3, batch 8
    attention_lr: PositiveFloat = 1e-3
    attention_batch_size: PositiveInt = 8
    attention_seed: NonNegativeInt = 0  # the DAM's initialization and shuffling
    attention_conv_channels: PositiveInt = 128  # widths of the DAM (the paper gives none)
    attention_hidden: PositiveInt = 64
    attention_mode: Literal["mean", "per_image"] = "mean"  # "mean": one combined model per site from the mean
    # per-image softmax; "per_image": one combined model per image
    features_timeout: PositiveInt = 600  # seconds the feature task waits for the sites
    eval_timeout: PositiveInt = 3600  # seconds the evaluation of the MLA model waits for the sites


class FedDGConfig(_Section):
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    ga: GAConfig = Field(default_factory=GAConfig)
    gradalign: GradAlignConfig = Field(default_factory=GradAlignConfig)
    elcfs: ELCFSConfig = Field(default_factory=ELCFSConfig)
    mla: MLAConfig = Field(default_factory=MLAConfig)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


# Keys a configuration must name itself (a missing one would silently mean the synthetic prostate default).
REQUIRED_KEYS = (("data",), ("data", "task"), ("data", "root"))


def validate(cfg: FedDGConfig) -> FedDGConfig:
    """The checks that relate fields to each other (each field's own type and range are the schema's)."""
    d = cfg.data
    if len(set(d.sites)) != len(d.sites):
        raise ConfigError(f"data.sites: the site names must be distinct, got {d.sites}")
    if d.unseen_site not in d.sites:
        raise ConfigError(f"data.unseen_site: {d.unseen_site!r} is not one of data.sites {d.sites}")
    if not d.train_sites:
        raise ConfigError(f"data.sites: no training site: {d.sites} holds only the unseen site {d.unseen_site!r}")
    if LAYOUT_TASKS[d.layout] != d.task:
        fitting = [name for name, task in LAYOUT_TASKS.items() if task == d.task]
        raise ConfigError(f"data.layout: {d.layout!r} holds {LAYOUT_TASKS[d.layout]} data, not {d.task} data; "
                          f"choose one of {fitting}")
    if d.image_size < 16 or d.image_size % 16:
        raise ConfigError(f"data.image_size: must be a multiple of 16 (four poolings), got {d.image_size}")
    t = cfg.train
    if t.min_sites is not None and t.min_sites > len(d.train_sites):
        raise ConfigError(f"train.min_sites: must be between 1 and {len(d.train_sites)} (the training sites), "
                          f"got {t.min_sites}")
    e = cfg.elcfs
    others = max(len(d.train_sites) - 1, 1)
    if e.transforms_per_image is not None and e.transforms_per_image > others:
        raise ConfigError(f"elcfs.transforms_per_image: must be between 1 and {others} (the other training sites) "
                          f"or null, got {e.transforms_per_image}")
    if e.lam_range[0] > e.lam_range[1]:
        raise ConfigError(f"elcfs.lam_range: must be [low, high] with low <= high, got {e.lam_range}")
    return cfg


def mla_feature_width(cfg: FedDGConfig) -> int:
    """The width of MLA's feature vectors (Eq. 2): the random encoder's last stage, or the deepest encoder level
    of the network for the global model's encoder."""
    if cfg.mla.encoder == "global":
        return int(cfg.model.features[4])
    return int(cfg.mla.encoder_width * 2 ** (cfg.mla.encoder_depth - 1))


def config_from_dict(raw: Any) -> FedDGConfig:
    """Validate an experiment given as plain data (a parsed ``feddg.yaml``, a checkpoint's stored config).

    Raises :class:`ConfigError` naming the field path and the value; every problem of the schema is listed."""
    if not isinstance(raw, dict) or not raw:
        raise ConfigError("the configuration is empty; it must name at least data.task and data.root "
                          "(null for the synthetic default)" if not raw else
                          f"expected a mapping of sections, got {type(raw).__name__}")
    for path in REQUIRED_KEYS:
        node: Any = raw
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and path[-1] not in node:
            raise ConfigError(f"{'.'.join(path)}: missing; "
                              + ("the data section is required" if path == ("data",) else
                                 "name it explicitly (data.root: null means the synthetic default)"))
    try:
        cfg = FedDGConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(e, FedDGConfig)) from None
    return validate(cfg)


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _section_at(schema: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The schema class of the mapping that holds ``loc``'s last key (for listing the known keys)."""
    cls: Any = schema
    for part in loc[:-1]:
        field = cls.model_fields.get(part) if isinstance(part, str) else None
        cls = field.annotation if field is not None else None
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            return None
    return cls


def describe_validation_error(error: ValidationError, schema: type[BaseModel]) -> str:
    """Every problem of a pydantic validation as ``field.path: what is wrong (got value)``, joined by "; "."""
    return "; ".join(_describe(err, schema) for err in error.errors())


def _describe(err: Any, schema: type[BaseModel]) -> str:
    loc = tuple(err["loc"])
    where = _field_path(loc)
    if err["type"] == "extra_forbidden":
        section = _section_at(schema, loc)
        known = f"; known keys are {sorted(section.model_fields)}" if section is not None else ""
        return f"{where}: unknown key{known}"
    if err["type"] == "model_type" and err["input"] is None:
        return f"{where}: the section is empty"
    message = err["msg"]
    message = message[0].lower() + message[1:] if message else message
    return f"{where}: {message} (got {err['input']!r})"


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader with two fixes for configuration files: a key repeated in one mapping is an error
    (PyYAML keeps the last value silently), and exponent floats without a dot (``1e-3``, ``5E4``) are floats as
    in YAML 1.2 and JSON (PyYAML's YAML 1.1 rules read them as strings)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"found the key {key!r} twice (first on line {seen[key].line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def read_yaml(path: str | os.PathLike) -> Any:
    """A YAML file read with :class:`_StrictLoader`; ConfigError naming the file (and line) when it cannot be."""
    path = Path(path)
    try:
        return yaml.load(path.read_text(), Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the configuration: {e}") from e


def load_config(path: str | os.PathLike) -> FedDGConfig:
    """Read and validate a ``feddg.yaml``; errors name the file, the field and the value."""
    raw = read_yaml(path)
    try:
        return config_from_dict(raw)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def parse_overrides(assignments: list[str]) -> dict[str, Any]:
    """``["train.rounds=20", "data.unseen_site=BMC"]`` -> ``{"train": {"rounds": 20}, "data": {"unseen_site": "BMC"}}``.

    Each value is read as YAML with the rules of ``feddg.yaml`` (``20`` an integer, ``1e-3`` a float, ``null``,
    ``[BMC, HK]`` a list, anything else a string). Whether the key exists and the value fits is the schema's
    business: merge the result into an experiment and validate it (:func:`config_from_dict`), which names an unknown
    key or a wrong type. ConfigError for an assignment that is not ``dotted.key=value``."""
    out: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(p.strip() for p in parts):
            raise ConfigError(f"--set {assignment!r}: expected section.key=value, e.g. train.rounds=20")
        try:
            value = yaml.load(text, Loader=_StrictLoader) if text.strip() else ""  # noqa: S506 - a SafeLoader
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {assignment!r}: cannot read the value: {e}") from None
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part.strip(), {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {assignment!r}: {part} is set to a value by another --set")
            node = child
        if isinstance(node.get(parts[-1].strip()), dict):
            raise ConfigError(f"--set {assignment!r}: {key.strip()} is a section, not a value")
        node[parts[-1].strip()] = value
    return out
