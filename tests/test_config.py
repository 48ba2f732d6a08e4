"""The experiment schema (``feddg.yaml``) and the site's ``feddg_site.json``: every value that used to pass in the
wrong form, or fail late without naming its field, is refused by name, with the file and the value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from feddg.config import ConfigError, FedDGConfig
from feddg.experiment import experiment_from_dict, load_experiment
from feddg.flare.site_config import SiteConfig, SiteConfigError, read_site_config
from tests.conftest import REPOSITORY

JOB_CONFIG = REPOSITORY / "jobs" / "prostate_ga" / "app" / "config" / "feddg.yaml"


def _job_text() -> str:
    return JOB_CONFIG.read_text()


def _with(section: str, key: str, value_yaml: str) -> str:
    """The headline job's feddg.yaml with ``section.key`` set to the literal YAML ``value_yaml``."""
    raw = yaml.safe_load(_job_text())
    raw[section][key] = "__PLACEHOLDER__"
    return yaml.safe_dump(raw, sort_keys=False).replace("__PLACEHOLDER__", value_yaml).replace("'", "")


def _load(tmp_path: Path, text: str) -> FedDGConfig:
    path = tmp_path / "feddg.yaml"
    path.write_text(text)
    return load_experiment(path)


# (section, key, YAML value as written, the words the error must contain besides the file and the field)
BAD_VALUES = [
    ("train", "augment", '"false"', "'false'"),
    ("data", "train_empty_slices", '"no"', "'no'"),
    ("data", "sites", "RUNMC", "valid list"),
    ("data", "sites", "[RUNMC]", "no training site"),
    ("model", "norm", "group", "'group'"),
    ("model", "dropout", "1.5", "1.5"),
    ("train", "lr", "-0.001", "-0.001"),
    ("train", "lr", ".nan", "nan"),
    ("train", "batch_size", "4.5", "4.5"),
    ("data", "image_size", "64.0", "64.0"),
    ("data", "image_size", '"64"', "'64'"),
    ("data", "image_size", "72", "multiple of 16"),
    ("eval", "batch_size", "0", "0"),
    ("data", "root", "123", "123"),
    ("data", "layout", "dofe_png", "holds fundus data"),
    ("data", "unseen_site", "Mars", "'Mars'"),
    ("data", "sites", "[BIDMC, RUNMC, BIDMC]", "distinct"),
    ("data", "sites", "[BIDMC, ../RUNMC]", "../RUNMC"),
    ("train", "min_sites", "9", "9"),
    ("train", "local_steps", "0", "0"),
    ("data", "zscore", "image", "'image'"),
    ("train", "rounds", "true", "True"),
    ("ga", "step_size", "-0.05", "-0.05"),
    ("ga", "step_size", "1.0", "1.0"),
]


@pytest.mark.parametrize("section,key,value,words", BAD_VALUES, ids=[f"{s}.{k}={v}" for s, k, v, _ in BAD_VALUES])
def test_bad_value_is_refused_naming_file_field_and_value(tmp_path, section, key, value, words):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, _with(section, key, value))
    message = str(err.value)
    assert str(tmp_path / "feddg.yaml") in message
    assert f"{section}.{key}" in message
    assert words in message
    assert "\n" not in message


def test_every_problem_of_the_schema_is_listed_at_once(tmp_path):
    raw = yaml.safe_load(_job_text())
    raw["train"]["lr"] = -1
    raw["model"]["norm"] = "group"
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, yaml.safe_dump(raw))
    assert "train.lr" in str(err.value) and "model.norm" in str(err.value)


def test_unknown_key_is_named_with_the_known_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.learning_rate: unknown key; known keys are \[.*'lr'"):
        _load(tmp_path, _with("train", "learning_rate", "0.01"))
    with pytest.raises(ConfigError, match=r"data\.synthetic\.sizes: unknown key"):
        raw = yaml.safe_load(_job_text())
        raw["data"]["synthetic"]["sizes"] = 3
        _load(tmp_path, yaml.safe_dump(raw))


def test_list_items_are_named_by_index(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.features\[2\]: .*got 0"):
        _load(tmp_path, _with("model", "features", "[16, 16, 0, 64, 128, 16]"))
    with pytest.raises(ConfigError, match=r"model\.features: .*6 items"):
        _load(tmp_path, _with("model", "features", "[16, 16, 32]"))


@pytest.mark.parametrize("text,words", [
    ("", "empty"),
    ("# only a comment\n", "empty"),
    ("data:\n", "data: the section is empty"),
    ("model:\n  norm: batch\n", "data: missing"),
    ("data:\n  task: prostate\n", "data.root: missing"),
    ("data:\n  root: null\n", "data.task: missing"),
    ("- data\n", "expected a mapping"),
])
def test_empty_or_partial_file_does_not_fall_back_to_synthetic_data(tmp_path, text, words):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    assert str(tmp_path / "feddg.yaml") in str(err.value)
    assert words in str(err.value)


def test_minimal_file_names_task_and_root(tmp_path):
    cfg = _load(tmp_path, "data:\n  task: prostate\n  root: null\n")
    assert cfg.data.root is None and cfg.data.task == "prostate"


def test_repeated_key_is_refused_by_the_reader(tmp_path):
    text = _job_text().replace("  rounds: 4\n", "  rounds: 4\n  rounds: 40\n")
    with pytest.raises(ConfigError, match=r"found the key 'rounds' twice \(first on line \d+\)"):
        _load(tmp_path, text)
    text = _job_text().replace("eval:\n", "train:\n  lr: 0.1\neval:\n")
    with pytest.raises(ConfigError, match="found the key 'train' twice"):
        _load(tmp_path, text)


@pytest.mark.parametrize("written,value", [("1e-3", 1e-3), ("5E-4", 5e-4), ("+2e-2", 2e-2), ("1.0e-3", 1e-3),
                                           ("1", 1.0), ("0.01", 0.01)])
def test_exponent_floats_are_floats(tmp_path, written, value):
    cfg = _load(tmp_path, _with("train", "lr", written))
    assert cfg.train.lr == pytest.approx(value) and isinstance(cfg.train.lr, float)


def test_exponent_integers_stay_refused_where_an_integer_is_meant(tmp_path):
    with pytest.raises(ConfigError, match="train.rounds"):
        _load(tmp_path, _with("train", "rounds", "1e2"))


def test_unreadable_yaml_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the configuration"):
        _load(tmp_path, "data: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot read the configuration"):
        load_experiment(tmp_path / "absent.yaml")


def test_every_committed_job_config_passes_the_schema():
    for path in sorted((REPOSITORY / "jobs").glob("*/app/config/feddg.yaml")):
        load_experiment(path)


def test_config_round_trips_through_its_dict():
    raw = yaml.safe_load(_job_text())
    cfg = experiment_from_dict(raw)
    assert experiment_from_dict(cfg.to_dict()) == cfg
    assert experiment_from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


# ------------------------------------------------------------------------------------------- feddg_site.json


@pytest.mark.parametrize("content,words", [
    ({"share_local_model": "yes"}, "share_local_model: input should be a valid boolean (got 'yes')"),
    ({"share_local_model": 1}, "share_local_model"),
    ({"amplitude_bank_images": -1}, "amplitude_bank_images: input should be greater than or equal to 0"),
    ({"amplitude_bank_images": 2.5}, "amplitude_bank_images"),
    ({"amplitude_bank_image": 10}, "amplitude_bank_image: unknown key; known keys are"),
    ([1, 2], "expected a JSON object"),
])
def test_site_config_is_strict(tmp_path, content, words):
    path = tmp_path / "feddg_site.json"
    path.write_text(json.dumps(content))
    with pytest.raises(SiteConfigError) as err:
        read_site_config(str(path))
    assert str(path) in str(err.value) and words in str(err.value)


def test_site_config_defaults_and_values(tmp_path):
    assert read_site_config(str(tmp_path / "absent.json")) == SiteConfig()
    path = tmp_path / "feddg_site.json"
    path.write_text(json.dumps({"amplitude_bank_images": 100, "share_local_model": True}))
    assert read_site_config(str(path)) == SiteConfig(amplitude_bank_images=100, share_local_model=True)
    path.write_text("{not json")
    with pytest.raises(SiteConfigError, match="cannot read the site configuration"):
        read_site_config(str(path))
