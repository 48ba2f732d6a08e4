"""The check every MLA feature matrix passes before it joins the domain feature bank."""

from __future__ import annotations

import numpy as np
import pytest

from feddg.methods.mla.features import check_feature_matrix


@pytest.mark.parametrize(
    "x, kw, message",
    [
        ([[1.0, 2.0]], {}, "expected a numpy array, got list"),
        (np.zeros((2, 3, 1), np.float32), {}, "expected 2 dimensions"),
        (np.zeros((2, 3), np.int64), {}, "floating-point dtype, got int64"),
        (np.array([[0.0, 1.0], [np.inf, 0.0]]), {}, "1 NaN/Inf value.* first in row 1"),
        (np.zeros((2, 3), np.float32), {"width": 4}, "expected 4 features per image, got 3"),
        (np.zeros((5, 3), np.float32), {"max_rows": 4}, "5 rows is more than the allowed 4"),
    ],
)
def test_check_feature_matrix_names_the_problem(x, kw, message):
    with pytest.raises(ValueError, match=message):
        check_feature_matrix(x, **kw)


def test_check_feature_matrix_accepts_good_and_empty_matrices():
    check_feature_matrix(np.zeros((3, 4), np.float32), width=4, max_rows=3)
    check_feature_matrix(np.zeros((0, 4), np.float64), width=4)
