"""The job-start fingerprint: version plus preprocessing hash, and the server's mismatch message."""

import inspect
from pathlib import Path

import pytest

from feddg.data import layouts, synthetic
from feddg.experiment import experiment_from_dict
from feddg.flare.site_info import (
    HASH_KEY,
    VERSION_KEY,
    mismatch,
    preprocessing_hash,
    preprocessing_modules,
    site_fingerprint,
)
from tests.conftest import tiny_experiment



def _modules(package) -> list[str]:
    """Every module of ``package``, read from its folder (not from what the hash code lists)."""
    return sorted(f"{package.__name__}.{p.stem}" for p in Path(package.__file__).parent.glob("*.py")
                  if p.stem != "__init__")


SYNTHETIC_MODULES = _modules(synthetic)
LAYOUT_MODULES = _modules(layouts)
PREPROCESSING = ["feddg.data.dataset", "feddg.layouts", "feddg.data.layouts", *LAYOUT_MODULES, "feddg.data.synthetic",
                 *SYNTHETIC_MODULES]


def _cfg(**data):
    exp = tiny_experiment("prostate")
    exp["data"].update(data)
    return experiment_from_dict(exp)


def test_the_hash_ignores_where_the_data_lives_but_not_how_it_is_preprocessed():
    base = preprocessing_hash(_cfg(root="/data/a"))
    assert preprocessing_hash(_cfg(root="/mnt/other/place")) == base
    assert preprocessing_hash(_cfg(root="/data/a", cache_dir="/tmp/x")) == base
    assert preprocessing_hash(_cfg(root="/data/a", image_size=64)) != base
    assert preprocessing_hash(_cfg(root="/data/a", zscore="slice")) != base
    fp = site_fingerprint(_cfg())
    assert set(fp) == {VERSION_KEY, HASH_KEY} and len(fp[HASH_KEY]) == 16


def test_the_hash_reads_every_module_of_the_layouts_and_the_synthetic_generator_in_a_fixed_order():
    names = [m.__name__ for m in preprocessing_modules()]
    assert len(SYNTHETIC_MODULES) >= 3  # common, fundus, prostate
    assert len(LAYOUT_MODULES) >= 3  # one per layout, at least
    assert names == PREPROCESSING


@pytest.mark.parametrize("module", PREPROCESSING)
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
