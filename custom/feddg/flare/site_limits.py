"""The limits a hospital's egress filter applies whatever the job asks, declared without the training stack.

One limit guards the tasks every method has (``max_parameters``: the most values a model update may carry); each
method part adds the limits of its own payloads (:attr:`feddg.flare.method_spec.MethodPart.site_limits`, read through
:func:`feddg.flare.registry.site_limits`). The site's egress filter (:mod:`feddg.flare.egress_filter`), the site policy
that installs it (:mod:`feddg.flare.site_policy`) and the options of ``feddg install-policy`` all read them from
here. This module imports no torch and no NVFlare, so that ``feddg install-policy --help`` lists the limits at once.
"""

from __future__ import annotations

from feddg.flare import registry
from feddg.flare.method_spec import SiteLimit

DEFAULT_MAX_PARAMETERS = 50_000_000  # a site's limit on the values of a model update when its policy names none
# (the papers' U-Net at 384 px has about 2 million)

MAX_PARAMETERS = SiteLimit("max_parameters", DEFAULT_MAX_PARAMETERS,
                           f"most values a model update may carry (default {DEFAULT_MAX_PARAMETERS})")


def all_site_limits() -> dict[str, SiteLimit]:
    """Every limit a site's egress filter takes, by name: the shared one, then the registered methods'."""
    return {MAX_PARAMETERS.name: MAX_PARAMETERS, **registry.site_limits()}


def egress_limits(**given: int | None) -> dict[str, int | None]:
    """Every limit with its value: ``given`` where set (not None), the default otherwise. ValueError naming an
    unknown limit (with the known ones) or a value that is not a whole number of at least 1."""
    known = all_site_limits()
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"unknown site limit(s) {unknown}; the limits are {sorted(known)}")
    limits = {name: limit.default for name, limit in known.items()}
    for name, value in given.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name.replace('_', '-')}: must be a whole number of at least 1, got {value!r}")
        limits[name] = value
    return limits
