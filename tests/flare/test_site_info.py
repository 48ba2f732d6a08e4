"""The job-start fingerprint: version plus preprocessing hash, and the server's mismatch message."""

from feddg.config import config_from_dict
from feddg.flare.site_info import HASH_KEY, VERSION_KEY, mismatch, preprocessing_hash, site_fingerprint
from tests.conftest import tiny_experiment


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


def test_mismatch_names_the_groups_of_sites():
    same = {VERSION_KEY: "0.1.0", HASH_KEY: "aaaa"}
    assert mismatch({"A": same, "B": same}) is None
    message = mismatch({"A": same, "B": same, "C": {VERSION_KEY: "0.2.0", HASH_KEY: "aaaa"},
                        "D": {VERSION_KEY: "0.1.0", HASH_KEY: "bbbb"}})
    assert message.startswith("the sites differ")
    assert "['A', 'B'] run feddg 0.1.0 with preprocessing aaaa" in message
    assert "['C'] run feddg 0.2.0" in message and "['D'] run feddg 0.1.0 with preprocessing bbbb" in message
