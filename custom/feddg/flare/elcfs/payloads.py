"""The payloads of ELCFS's amplitude exchange, their builders and their checks (used by the site that sends them,
the job's :class:`~feddg.flare.elcfs.filter.AmplitudeWindowFilter`, the site's egress filter and the server's
exchange alike), and the one function that derives the window from the experiment.

  * result of the ``amplitude_spectra`` task, DXO kind ``AMPLITUDE_WINDOW``:
      data {"amplitude_window": float32 (N, C, 2 b_h + 1, 2 b_w + 1), non-negative, finite}
      meta {"payload": "amplitude_window", "half_widths": [b_h, b_w], "num_images": N, "image_size": [H, W]}
  * data of the ``amplitude_bank`` task, DXO kind ``AMPLITUDE_BANK``:
      data {site: float32 (N_site, C, 2 b_h + 1, 2 b_w + 1)}
      meta {"payload": "amplitude_bank", "half_widths": [b_h, b_w]}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from nvflare.apis.dxo import DXO

from feddg.config import ConfigError, FedDGConfig
from feddg.flare.elcfs.names import DEFAULT_MAX_HALF_WIDTH, ELCFSTask  # noqa: F401 - the exchange's names
from feddg.flare.payloads import PayloadRejected, check_declared_meta
from feddg.methods.frequency import window_half_widths



AMPLITUDE_WINDOW = "AMPLITUDE_WINDOW"
AMPLITUDE_BANK = "AMPLITUDE_BANK"
_WINDOW_KEY = "amplitude_window"


def amplitude_half_widths(cfg: FedDGConfig) -> tuple[int, int]:
    """(b_h, b_w): the half-widths of the amplitude window the job exchanges, from ``data.image_size`` and
    ``elcfs.alpha`` / ``elcfs.min_half_width`` (:func:`feddg.methods.frequency.window_half_widths`). The one place
    this value is derived: the sites, the server's exchange and every filter call it at run time."""
    size = cfg.data.image_size
    try:
        return window_half_widths(size, size, cfg.elcfs.alpha, cfg.elcfs.min_half_width)
    except ValueError as e:
        raise ConfigError(f"data.image_size / elcfs.alpha: {e}") from e


def amplitude_window_dxo(windows: np.ndarray, half_widths: tuple[int, int], image_size: tuple[int, int]) -> DXO:
    windows = np.ascontiguousarray(windows, dtype=np.float32)
    return DXO(data_kind=AMPLITUDE_WINDOW, data={_WINDOW_KEY: windows},
               meta={"payload": "amplitude_window", "half_widths": [int(half_widths[0]), int(half_widths[1])],
                     "num_images": int(windows.shape[0]), "image_size": [int(image_size[0]), int(image_size[1])]})


def amplitude_bank_dxo(bank: Mapping[str, np.ndarray], half_widths: tuple[int, int]) -> DXO:
    return DXO(data_kind=AMPLITUDE_BANK,
               data={site: np.ascontiguousarray(a, dtype=np.float32) for site, a in bank.items()},
               meta={"payload": "amplitude_bank", "half_widths": [int(half_widths[0]), int(half_widths[1])]})

def _declared_half_widths(value: Any) -> tuple[int, int]:
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        raise PayloadRejected(f"meta 'half_widths' must be two non-negative integers, got {value!r}")
    return int(value[0]), int(value[1])


def check_window_array(
    a: Any,
    half_widths: tuple[int, int],
    where: str,
    max_channels: int = 3,
) -> np.ndarray:
    """One site's windows: float (N, C, 2 b_h + 1, 2 b_w + 1), C <= ``max_channels``, finite, non-negative."""
    if not isinstance(a, np.ndarray):
        raise PayloadRejected(f"{where}: expected a numpy array, got {type(a).__name__}")
    if a.dtype.kind != "f":
        raise PayloadRejected(f"{where}: expected floats, got dtype {a.dtype}")
    bh, bw = half_widths
    if a.ndim != 4 or a.shape[2:] != (2 * bh + 1, 2 * bw + 1) or not 1 <= a.shape[1] <= max_channels:
        raise PayloadRejected(f"{where}: shape {a.shape} is not (images, channels <= {max_channels}, "
                              f"{2 * bh + 1}, {2 * bw + 1}), the declared amplitude window")
    if not np.all(np.isfinite(a)):
        raise PayloadRejected(f"{where}: holds NaN or infinite values")
    if np.any(a < 0):
        raise PayloadRejected(f"{where}: holds negative values, which an amplitude never has (phase or image data?)")
    return a


def _check_half_widths(declared: tuple[int, int], half_widths: tuple[int, int] | None, max_half_width: int) -> None:
    if half_widths is not None and tuple(declared) != tuple(half_widths):
        raise PayloadRejected(f"declared window half-widths {list(declared)} differ from the configured "
                              f"{list(half_widths)}")
    if max(declared) > max_half_width:
        raise PayloadRejected(f"window half-widths {list(declared)} exceed the allowed {max_half_width} "
                              f"(a low-frequency window, not a spectrum)")


def check_amplitude_payload(
    dxo: DXO | None,
    half_widths: tuple[int, int] | None = None,
    max_half_width: int = DEFAULT_MAX_HALF_WIDTH,
    max_images: int | None = None,
) -> np.ndarray:
    """The result of the amplitude task is exactly the declared window payload; returns the windows.

    Args:
        dxo: the result's DXO.
        half_widths: the job's (b_h, b_w), or None to accept any declared window up to ``max_half_width``.
        max_half_width: the largest half-width a site lets out.
        max_images: the most images a site lets out (None: no cap).
    """
    if dxo is None or dxo.data_kind != AMPLITUDE_WINDOW:
        raise PayloadRejected(f"expected a DXO of kind {AMPLITUDE_WINDOW}, got {getattr(dxo, 'data_kind', None)}")
    if not isinstance(dxo.data, dict) or set(dxo.data) != {_WINDOW_KEY}:
        keys = sorted(map(str, dxo.data)) if isinstance(dxo.data, dict) else type(dxo.data).__name__
        raise PayloadRejected(f"expected exactly the data key {_WINDOW_KEY!r}, got {keys}")
    check_declared_meta(dxo, ("payload", "half_widths", "num_images", "image_size"))
    declared = _declared_half_widths(dxo.get_meta_prop("half_widths"))
    _check_half_widths(declared, half_widths, max_half_width)
    windows = check_window_array(dxo.data[_WINDOW_KEY], declared, _WINDOW_KEY)
    n = windows.shape[0]
    if dxo.get_meta_prop("num_images") != n:
        raise PayloadRejected(f"meta num_images {dxo.get_meta_prop('num_images')!r} differs from the {n} windows sent")
    if max_images is not None and n > max_images:
        raise PayloadRejected(f"{n} images exceed the allowed {max_images}")
    return windows


def check_amplitude_bank(
    dxo: DXO | None,
    half_widths: tuple[int, int] | None = None,
    max_half_width: int = DEFAULT_MAX_HALF_WIDTH,
    known_sites: Iterable[str] | None = None,
) -> dict[str, np.ndarray]:
    """The bank a site receives: site -> windows of one declared shape, from known sites only."""
    if dxo is None or dxo.data_kind != AMPLITUDE_BANK:
        raise PayloadRejected(f"expected a DXO of kind {AMPLITUDE_BANK}, got {getattr(dxo, 'data_kind', None)}")
    if not isinstance(dxo.data, dict) or not dxo.data:
        raise PayloadRejected("the amplitude bank is empty")
    check_declared_meta(dxo, ("payload", "half_widths"))
    declared = _declared_half_widths(dxo.get_meta_prop("half_widths"))
    _check_half_widths(declared, half_widths, max_half_width)
    if known_sites is not None:
        unknown = sorted(set(map(str, dxo.data)) - set(known_sites))
        if unknown:
            raise PayloadRejected(f"the bank names unknown sites {unknown}")
    bank = {str(site): check_window_array(a, declared, f"bank entry {site!r}") for site, a in dxo.data.items()}
    if len({a.shape[1] for a in bank.values()}) > 1:
        raise PayloadRejected("bank entries disagree in their number of channels")
    return bank
