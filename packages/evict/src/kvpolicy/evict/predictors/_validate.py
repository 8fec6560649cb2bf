"""Input checks shared by the return predictors."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["as_feature_matrix"]


def as_feature_matrix(
    features: object, columns: int | None, name: str = "features"
) -> NDArray[np.float64]:
    """Return ``features`` as a finite (n, k) float64 array, or raise naming ``name``.

    Args:
        features: (n, k) array-like of numbers.
        columns: the k the caller needs, or None for any.
        name: parameter name used in error messages.

    Raises:
        TypeError: not a numeric array.
        ValueError: wrong number of dimensions or columns, or a NaN/inf entry.
    """
    if not isinstance(features, np.ndarray):
        raise TypeError(f"'{name}' must be a numpy array: {type(features).__name__}")
    if features.dtype.kind not in "fiu":
        raise TypeError(f"'{name}' must hold numbers: dtype {features.dtype}")
    if features.ndim != 2:
        raise ValueError(f"'{name}' must be 2-D (n, k): shape {features.shape}")
    if columns is not None and features.shape[1] != columns:
        raise ValueError(f"'{name}' must have {columns} columns: shape {features.shape}")
    out = np.asarray(features, dtype=np.float64)
    if not np.isfinite(out).all():
        raise ValueError(
            f"'{name}' must be finite: {int((~np.isfinite(out)).sum())} NaN/inf entries"
        )
    return out
