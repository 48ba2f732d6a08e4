"""The feature-matrix check of MLA-BIN (Zhu et al.), section 2.2, Eq. (2)-(3): the vectors C_n^t a site sends
(N images x C features) are checked before they join the domain feature bank that trains the domain attention
module, and so are the unseen domain's vectors before the DAM weighs them.
"""

from __future__ import annotations

import numpy as np


def check_feature_matrix(x: object, width: int | None = None, max_rows: int | None = None) -> None:
    """Raise ValueError naming the problem unless ``x`` is a 2-D (N, C) floating-point numpy array of finite values
    with C = ``width`` columns (when given) and N <= ``max_rows`` rows (when given). Zero rows are allowed (a site
    with no images); a site's feature upload is checked with this before it joins the bank."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"feature matrix: expected a numpy array, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"feature matrix: expected 2 dimensions (images, features), got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"feature matrix: expected a floating-point dtype, got {x.dtype}")
    finite = np.isfinite(x)
    if not finite.all():
        bad_rows = np.flatnonzero(~finite.all(axis=1))
        raise ValueError(f"feature matrix: {int((~finite).sum())} NaN/Inf value(s) in {bad_rows.size} row(s), "
                         f"first in row {int(bad_rows[0])}")
    if width is not None and x.shape[1] != width:
        raise ValueError(f"feature matrix: expected {width} features per image, got {x.shape[1]}")
    if max_rows is not None and x.shape[0] > max_rows:
        raise ValueError(f"feature matrix: {x.shape[0]} rows is more than the allowed {max_rows}")
