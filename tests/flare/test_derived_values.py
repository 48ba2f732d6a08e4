"""Values derived from feddg.yaml are computed where they are used, at run time: editing the YAML of a generated job
can make no filter argument stale (the frozen amplitude window blocked every site at 208 px and more)."""

from __future__ import annotations

import hashlib
import json
import zlib

import numpy as np
import pytest
from nvflare.apis.fl_constant import FilterKey, FLContextKey

from feddg.experiment import experiment_from_dict

from feddg.flare.constants import TASK_REQUEST_INTERVAL
from feddg.flare.elcfs.filter import AmplitudeWindowFilter
from feddg.flare.elcfs.payloads import ELCFSTask, amplitude_half_widths, amplitude_window_dxo
from feddg.flare.mla.filter import FeatureMatrixFilter
from feddg.flare.mla.payloads import MLATask, feature_matrix_dxo
from feddg.jobs import JOBS
from feddg.recipes.export import job_files
from feddg.methods.frequency import amplitude_window
from feddg.seeds import round_seed, split_seed
from tests.conftest import tiny_experiment
from tests.flare.fl_context import make_context

CONFIG_JSON = ("app/config/config_fed_client.json", "app/config/config_fed_server.json")


def _outgoing(fl_ctx, task):
    fl_ctx.set_prop(FLContextKey.TASK_NAME, task, private=True, sticky=False)
    fl_ctx.set_prop(FLContextKey.FILTER_DIRECTION, FilterKey.OUT, private=True, sticky=False)
    return fl_ctx


@pytest.mark.parametrize("size,expected", [(32, (1, 1)), (64, (1, 1)), (208, (2, 2)), (256, (2, 2)), (384, (3, 3))])
def test_amplitude_half_widths_follow_the_image_size(size, expected):
    exp = tiny_experiment("prostate")
    exp["data"]["image_size"] = size
    assert amplitude_half_widths(experiment_from_dict(exp)) == expected


@pytest.mark.parametrize("size", [64, 208, 256])
def test_the_job_filter_takes_the_window_from_the_yaml(tmp_path, size):
    exp = tiny_experiment("prostate")
    exp["data"]["image_size"] = size
    fl_ctx, _ = make_context(tmp_path, "BIDMC", exp)
    hw = amplitude_half_widths(experiment_from_dict(exp))
    images = np.random.default_rng(0).normal(size=(3, 1, size, size)).astype(np.float32)
    good = amplitude_window_dxo(amplitude_window(images, hw), hw, (size, size)).to_shareable()
    assert AmplitudeWindowFilter().process(good, _outgoing(fl_ctx, ELCFSTask.AMPLITUDE_SPECTRA)) is good
    other = (hw[0] + 1, hw[1] + 1)
    wrong = amplitude_window_dxo(amplitude_window(images, other), other, (size, size)).to_shareable()
    with pytest.raises(Exception, match="differ from the configured"):
        AmplitudeWindowFilter().process(wrong, _outgoing(fl_ctx, ELCFSTask.AMPLITUDE_SPECTRA))


def test_the_feature_filter_takes_width_and_rows_from_the_yaml(tmp_path):
    exp = tiny_experiment("prostate")
    exp["mla"] = {"encoder_width": 8, "encoder_depth": 2, "feature_images": 4}
    fl_ctx, _ = make_context(tmp_path, "BIDMC", exp)
    ok = feature_matrix_dxo(np.zeros((4, 16), np.float32)).to_shareable()
    assert FeatureMatrixFilter().process(ok, _outgoing(fl_ctx, MLATask.MLA_FEATURES)) is ok
    for shape in ((4, 32), (5, 16)):  # another width than the encoder's, more rows than mla.feature_images
        bad = feature_matrix_dxo(np.zeros(shape, np.float32)).to_shareable()
        with pytest.raises(Exception, match="task mla_features"):
            FeatureMatrixFilter().process(bad, _outgoing(fl_ctx, MLATask.MLA_FEATURES))


def _numbers(node, path=""):
    """(path, value) of every number in a JSON tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path, node


@pytest.mark.parametrize("name", JOBS)
def test_no_generated_config_carries_an_experiment_value(name):
    """The NVFlare configs carry component wiring only: every experiment setting (GA's step size, gradient
    alignment's lambda, timeouts, window sizes, feature widths) is read from feddg.yaml at run time. The one number
    besides the format version is NVFlare's own polling interval, a constant of the package, not of the
    experiment."""
    files = job_files(name)
    engine = {".server.task_request_interval": TASK_REQUEST_INTERVAL}
    for rel in CONFIG_JSON:
        numbers = [(path, value) for path, value in _numbers(json.loads(files[rel]))
                   if not path.endswith("format_version") and engine.get(path) != value]
        assert numbers == [], f"{name}/{rel} carries {numbers}"


def test_editing_the_image_size_of_a_generated_elcfs_job_changes_no_nvflare_config():
    small, large = job_files("prostate_elcfs"), job_files("prostate_elcfs", {"data": {"image_size": 256}})
    for rel in CONFIG_JSON:
        assert small[rel] == large[rel]


def test_site_seeds_are_stable_and_distinct():
    assert split_seed(0, "BIDMC") == split_seed(0, "BIDMC") != split_seed(0, "BMC") != split_seed(1, "BMC")
    seeds = {round_seed(0, site, r) for site in ("BIDMC", "BMC") for r in range(3)}
    assert len(seeds) == 6 and all(0 <= s < 2**31 for s in seeds)
    # Fixed values: a change here changes every site's splits or training draws, and so every job's metrics.
    assert split_seed(0, "BIDMC") == int.from_bytes(hashlib.sha256(b"0/BIDMC").digest()[:8], "little")
    assert round_seed(0, "BIDMC", 2) == (zlib.crc32(b"BIDMC") + 2 * 7919) % 2**31
