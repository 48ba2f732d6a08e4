"""ELCFS's part of a job: the amplitude exchange before the rounds, the episodic executor, the job filter on both
exchange tasks, what a site's egress filter lets out on them, and the ``elcfs`` section of feddg.yaml.

ELCFS (section 4.2): gamma = 0.5 for prostate as in the paper; fundus 0.02 instead of the paper's 0.1 (measured:
at the CPU size the cup's boundary term out-pulls the cup's Dice term and the model marks cup along the image frame;
the methods page, "ELCFS"); the rest of the elcfs section keeps the paper's values (alpha 0.01 with a 3 x 3 floor at
CPU sizes, lambda ~ U(0, 1), beta 1e-3, tau 0.05, first order), written out in full; ``contrast_denominator: all``:
see :mod:`feddg.methods.boundary` (measured)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from feddg.config import FedDGConfig
from feddg.experiment import Section
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.elcfs import settings
from feddg.flare.elcfs.names import DEFAULT_MAX_HALF_WIDTH, ELCFSTask
from feddg.flare.method_spec import Component, MethodPart, SiteLimit, TaskFilter

if TYPE_CHECKING:
    from nvflare.apis.dxo import DXO


_GUARD = Component("feddg.flare.elcfs.filter.AmplitudeWindowFilter", {"config_file": CONFIG_FILE})


def egress_amplitude_windows(dxo: DXO, cfg: FedDGConfig, limits: Mapping[str, Any]) -> None:
    """A site lets out amplitude windows within its own caps (any window the job declares up to them)."""
    from feddg.flare.elcfs.payloads import check_amplitude_payload  # torch: only where a site checks a payload

    check_amplitude_payload(dxo, None, limits["max_half_width"], limits["max_amplitude_images"])


PART = MethodPart(
    name="elcfs",
    executor="feddg.flare.elcfs.executor.ELCFSExecutor",
    tasks=(ELCFSTask.AMPLITUDE_SPECTRA, ELCFSTask.AMPLITUDE_BANK),
    before_rounds=(Component("feddg.flare.elcfs.exchange.AmplitudeExchange", {"config_file": CONFIG_FILE},
                             id="amplitude_exchange"),),
    result_filters=(TaskFilter((ELCFSTask.AMPLITUDE_SPECTRA,), _GUARD),),
    data_filters=(TaskFilter((ELCFSTask.AMPLITUDE_BANK,), _GUARD),),
    site_data_filters=(Component("feddg.flare.elcfs.filter.AmplitudeWindowFilter", {"max_half_width": None}),),
    section=Section("elcfs", settings.ELCFSSettings, "ELCFS (Liu et al., CVPR 2021): the amplitude exchange and "
                    "the boundary-oriented episodic learning", checks=(settings.check,)),
    task_experiment={"prostate": {"elcfs": {"boundary_weight": 0.5}}, "fundus": {"elcfs": {"boundary_weight": 0.02}}},
    egress={ELCFSTask.AMPLITUDE_SPECTRA: egress_amplitude_windows},
    site_limits=(
        SiteLimit("max_half_width", DEFAULT_MAX_HALF_WIDTH, "largest ELCFS amplitude window half-width that may "
                  f"leave or arrive (default {DEFAULT_MAX_HALF_WIDTH}: {2 * DEFAULT_MAX_HALF_WIDTH + 1} x "
                  f"{2 * DEFAULT_MAX_HALF_WIDTH + 1} values per channel)"),
        SiteLimit("max_amplitude_images", None,
                  "most images whose ELCFS amplitude windows may leave (default: no cap)"),
    ),
)
