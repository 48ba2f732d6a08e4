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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .layouts import LAYOUTS, layouts_for

TASKS = {
    # task -> (input channels, structure names). Fundus: disc is the union of rim and cup (multi-label).
    "prostate": (1, ("prostate",)),
    "fundus": (3, ("disc", "cup")),
}

Task = Literal["prostate", "fundus"]
LayoutName = Literal[tuple(LAYOUTS)]  # the layouts declared in feddg.layouts, each with the task its masks encode
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
SiteName = Annotated[str, Field(min_length=1, pattern=r"^[^/\\\s][^/\\]*$")]  # a folder name under data.root


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range; the message names the file
    (when there is one), the field path and the value."""


class Settings(BaseModel):
    """A section of ``feddg.yaml``: strict (no coercion between types; an int is accepted where a float is meant),
    unknown keys refused, no NaN/Inf. Every key carries ``Field(description=...)``: the feddg.yaml reference page is
    generated from them (:mod:`feddg.docs_reference`). A method's own section subclasses this model in its folder."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


def _list(*values: Any) -> Any:
    """A default_factory for a list default (pydantic copies mutable defaults, but a factory says so)."""
    return lambda: list(values)


class SyntheticConfig(Settings):
    """Size of the embedded synthetic multi-site data set and how its sites differ (generated on first use, then
    cached)."""

    seed: NonNegativeInt = Field(0, description="seed of the generated images and masks")
    cases_per_site: PositiveInt = Field(8, description="prostate: volumes per site; fundus: images per site "
                                                       "(train + test)")
    slices_per_case: PositiveInt = Field(12, description="slices of a synthetic prostate volume (prostate only)")
    size: PositiveInt = Field(96, description="in-plane size written to disk (px)")
    held_out_cases: PositiveInt | None = Field(None, description=(
        "cases of the unseen site instead of cases_per_site (more test cases narrow the intervals of a comparison "
        "and cost evaluation only); null: cases_per_site. Case i of a site is the same whatever the count, so the "
        "training sites' data does not depend on this setting"))
    shift: Literal["style_and_content", "style_only"] = Field("style_and_content", description=(
        "how the sites differ. style_and_content: each site has its own acquisition style (intensity curve, bias "
        "field, noise, blur, resolution, field of view, colour cast) and its own anatomy and labelling convention "
        "(prostate: gland size, shape, mask margin, smoothed or jagged outline, unlabelled apex/base slices; "
        "fundus: disc size and shape, cup-to-disc ratio, disc and cup margins, smoothed contours): a shift that "
        "exchanging image styles does not undo. style_only: the same anatomy and labelling at every site, sites "
        "differ by style alone (tables in feddg.data.synthetic.prostate and .fundus)"))


class DataConfig(Settings):
    """Where a task's data lives and how it is turned into 2D training samples."""

    task: Task = Field("prostate", description="the segmentation task: prostate (MRI) or fundus (optic disc and cup)")
    layout: LayoutName = Field("saml_nifti", description="how the data folder is organised (the data layouts page)")
    root: str | None = Field(None, description="the data folder, one sub-folder per site; null: the synthetic "
                                               "default, generated into the cache on first use")
    sites: list[SiteName] = Field(default_factory=_list("BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"),
                                  description="every site of the job (folder names under root), the unseen one "
                                              "included")
    unseen_site: SiteName = Field("RUNMC", description="the held-out site: it never trains and only evaluates")
    image_size: PositiveInt = Field(64, description="network input size (square, a multiple of 16); the papers "
                                                    "use 384")
    val_fraction: Annotated[float, Field(ge=0, lt=1)] = Field(0.2, description=(
        "case-level share of a training site's train data held out for validation"))
    split_seed: NonNegativeInt = Field(0, description="seed of the case-level train/validation split")
    zscore: Literal["volume", "slice"] = Field("volume", description="MRI intensity normalisation: per case or per "
                                                                     "slice")
    train_empty_slices: bool = Field(False, description="train on slices without foreground (evaluation always "
                                                        "uses all)")
    cache_dir: str | None = Field(None, description="where synthetic data and decoded slices are cached; null: "
                                                    "$FEDDG_CACHE or ~/.cache/feddg")
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig,
                                       description="the embedded synthetic data (read when root is null)")

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


class ModelConfig(Settings):
    """The 2D U-Net (MONAI BasicUNet): six feature widths, as BasicUNet takes them."""

    features: Annotated[list[PositiveInt], Field(min_length=6, max_length=6)] = Field(
        default_factory=_list(16, 16, 32, 64, 128, 16), description="BasicUNet's six feature widths")
    norm: Literal["batch", "instance"] = Field("batch", description="normalisation layers, as MONAI names them")
    dropout: Annotated[float, Field(ge=0, lt=1)] = Field(0.0, description="dropout probability of the U-Net")
    bin_levels: Annotated[int, Field(ge=0, le=5)] = Field(0, description=(
        "BIN-Net (MLA-BIN): batch-instance normalization in the top n encoder levels, 0-5 (the paper uses 3)"))


class TrainConfig(Settings):
    """Federated and local training settings."""

    rounds: PositiveInt = Field(5, description="federated rounds")
    local_epochs: PositiveInt = Field(1, description="local epochs per round")
    local_steps: PositiveInt | None = Field(None, description=(
        "optimizer steps per round instead of whole epochs (the gradient-alignment paper runs 1); null: "
        "local_epochs epochs"))
    batch_size: PositiveInt = Field(8, description="local training batch size")
    lr: PositiveFloat = Field(1e-3, description="Adam learning rate of the local training")
    fedprox_mu: NonNegativeFloat = Field(0.0, description="> 0 adds FedProx's proximal term to the local loss")
    augment: bool = Field(True, description="random flips, rotations and intensity augmentation of training slices")
    seed: NonNegativeInt = Field(0, description=(
        "the training seed: initial weights, data order, augmentation (a benchmark's seed sets it)"))
    min_sites: PositiveInt | None = Field(None, description="minimum training sites per round; null: all training "
                                                            "sites")
    task_timeout: PositiveInt = Field(3600, description=(
        "seconds a round waits for the sites before going on with those that answered"))
    amp: Literal["auto", "bf16", "fp16", "off"] = Field("auto", description=(
        "mixed precision of the sites' training (feddg.precision): auto = bf16 on CUDA, float32 on the CPU"))


class EvalConfig(Settings):
    """How the global model is scored."""

    largest_component: bool = Field(False, description="keep only the largest connected component of each "
                                                       "structure")
    batch_size: PositiveInt = Field(16, description="evaluation batch size")
    timeout: PositiveInt | None = Field(None, description=(
        "seconds the final evaluation waits for the sites; null: train.task_timeout"))


class FedDGConfig(Settings):
    """The base sections of every ``feddg.yaml``; a method's own section is added to the schema when the method is
    registered (:func:`feddg.experiment.experiment_schema`)."""

    data: DataConfig = Field(default_factory=DataConfig, description="the data: task, layout, sites, the unseen "
                                                                     "site, preprocessing")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the network")
    train: TrainConfig = Field(default_factory=TrainConfig, description="federated and local training")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="scoring of the global model")

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
    if LAYOUTS[d.layout].task != d.task:
        raise ConfigError(f"data.layout: {d.layout!r} holds {LAYOUTS[d.layout].task} data, not {d.task} data; "
                          f"choose one of {layouts_for(d.task)}")
    if d.image_size < 16 or d.image_size % 16:
        raise ConfigError(f"data.image_size: must be a multiple of 16 (four poolings), got {d.image_size}")
    t = cfg.train
    if t.min_sites is not None and t.min_sites > len(d.train_sites):
        raise ConfigError(f"train.min_sites: must be between 1 and {len(d.train_sites)} (the training sites), "
                          f"got {t.min_sites}")
    return cfg


def config_from_dict(raw: Any, schema: type[FedDGConfig] = FedDGConfig,
                     checks: Sequence[Callable[[FedDGConfig], None]] = ()) -> FedDGConfig:
    """Validate an experiment given as plain data (a parsed ``feddg.yaml``, a checkpoint's stored config) against
    ``schema`` (default: the base sections only; a job's methods add theirs: use
    :func:`feddg.experiment.experiment_from_dict`), then the base checks and ``checks``.

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
        cfg = schema.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(e, schema)) from None
    validate(cfg)
    for check in checks:
        check(cfg)
    return cfg


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


class StrictLoader(yaml.SafeLoader):
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


StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def read_yaml(path: str | os.PathLike) -> Any:
    """A YAML file read with :class:`StrictLoader`; ConfigError naming the file (and line) when it cannot be."""
    path = Path(path)
    try:
        return yaml.load(path.read_text(), Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the configuration: {e}") from e
