"""The job-start fingerprint: version plus preprocessing hash, and the server's mismatch message."""

import inspect
from pathlib import Path

import pytest

from feddg.config import config_from_dict
from feddg.data import synthetic
from feddg.flare.site_info import (
    HASH_KEY,
    VERSION_KEY,
    mismatch,
    preprocessing_hash,
    preprocessing_modules,
    site_fingerprint,
)
from tests.conftest import tiny_experiment

# Every module of the synthetic generator, read from its folder (not from what the hash code lists).
SYNTHETIC_MODULES = sorted(f"{synthetic.__name__}.{p.stem}" for p in Path(synthetic.__file__).parent.glob("*.py")
                           if p.stem != "__init__")


def _cfg(**data):
    exp = tiny_experiment("prostate")
    exp["data"].update(data)
    return config_from_dict(exp)


def test_the_hash_ignores_where_the_data_lives_but_not_how_it_is_preprocessed():
    base = preprocessing_hash(_cfg(root="/data/a"))
    assert preprocessing_hash(_cfg(root="/mnt/other/place")) == base
    assert preprocessing_hash(_cfg(root="/data/a", cache_dir="/tmp/x")) == base
    assert preprocessing_hash(_cfg(root="/data/a", image_size=64)) != base
    assert preprocessing_hash(_cfg(root="/data/a", zscore="slice")) != base
    fp = site_fingerprint(_cfg())
    assert set(fp) == {VERSION_KEY, HASH_KEY} and len(fp[HASH_KEY]) == 16


def test_the_hash_reads_every_module_of_the_synthetic_generator_in_a_fixed_order():
    names = [m.__name__ for m in preprocessing_modules()]
    assert len(SYNTHETIC_MODULES) >= 3  # common, fundus, prostate
    assert names == ["feddg.data.dataset", "feddg.data.layouts", "feddg.data.synthetic", *SYNTHETIC_MODULES]


@pytest.mark.parametrize("module", ["feddg.data.dataset", "feddg.data.layouts", "feddg.data.synthetic",
                                    *SYNTHETIC_MODULES])
def test_editing_any_preprocessing_module_changes_the_hash(monkeypatch, module):
    cfg = _cfg()
    base = preprocessing_hash(cfg)
    real = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda m: real(m) + ("# edited\n" if m.__name__ == module else ""))
    assert preprocessing_hash(cfg) != base


def test_mismatch_names_the_groups_of_sites():
    same = {VERSION_KEY: "0.1.0", HASH_KEY: "aaaa"}
    assert mismatch({"A": same, "B": same}) is None
    message = mismatch({"A": same, "B": same, "C": {VERSION_KEY: "0.2.0", HASH_KEY: "aaaa"},
                        "D": {VERSION_KEY: "0.1.0", HASH_KEY: "bbbb"}})
    assert message.startswith("the sites differ")
    assert "['A', 'B'] run feddg 0.1.0 with preprocessing aaaa" in message
    assert "['C'] run feddg 0.2.0" in message and "['D'] run feddg 0.1.0 with preprocessing bbbb" in message
