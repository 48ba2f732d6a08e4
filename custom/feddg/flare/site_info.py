"""What a site reports at job start so that the server can refuse to train on mismatched software or data handling.

Each site answers the ``site_info`` task with its ``feddg`` version and a hash of its data-preprocessing
configuration (the ``data`` section of the job as the site resolves it, minus where the data lives, plus the source
of the preprocessing code), as DXO METRICS of two short strings. The server groups the sites by (version, hash)
and, when there is more than one group, stops before the first round naming every group's sites.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import pkgutil
from collections.abc import Mapping
from types import ModuleType

import feddg
from feddg.config import FedDGConfig

VERSION_KEY = "feddg_version"
HASH_KEY = "preprocessing_hash"
# Where the data lives differs from site to site and does not change what the network sees.
_LOCATION_FIELDS = ("root", "cache_dir")


def _package(package: ModuleType) -> list[ModuleType]:
    """``package`` and every module in it, by name."""
    return [package, *(importlib.import_module(f"{package.__name__}.{info.name}")
                       for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name))]


def preprocessing_modules() -> list[ModuleType]:
    """The modules whose source goes into the hash, in a fixed order: the loader, the layouts' declaration, the
    layouts' package and every module in it, then the synthetic generator's package and every module in it (by
    name), so that editing any of them changes the hash."""
    from feddg import layouts as declaration
    from feddg.data import dataset, layouts, synthetic

    return [dataset, declaration, *_package(layouts), *_package(synthetic)]


def preprocessing_hash(cfg: FedDGConfig) -> str:
    """sha256 (first 16 hex digits) of the preprocessing settings and the preprocessing code
    (:func:`preprocessing_modules`)."""
    data = {k: v for k, v in cfg.data.model_dump().items() if k not in _LOCATION_FIELDS}
    if cfg.data.root is not None:
        data.pop("synthetic")  # only used when the synthetic default is generated
    h = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode())
    for module in preprocessing_modules():
        h.update(inspect.getsource(module).encode())
    return h.hexdigest()[:16]


def site_fingerprint(cfg: FedDGConfig) -> dict[str, str]:
    return {VERSION_KEY: feddg.__version__, HASH_KEY: preprocessing_hash(cfg)}


def mismatch(fingerprints: Mapping[str, Mapping[str, str]]) -> str | None:
    """None when every site reported the same fingerprint, else a message naming the groups of sites."""
    groups: dict[tuple[str, str], list[str]] = {}
    for site, fp in sorted(fingerprints.items()):
        groups.setdefault((str(fp.get(VERSION_KEY)), str(fp.get(HASH_KEY))), []).append(site)
    if len(groups) <= 1:
        return None
    parts = [f"{sites} run feddg {version} with preprocessing {digest}" for (version, digest), sites in
             sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))]
    return "the sites differ in package version or data preprocessing: " + "; ".join(parts)
