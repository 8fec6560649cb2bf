"""The constant return predictor: Token-PD without a forecaster (seed 000's ablation)."""

from __future__ import annotations

import math

import numpy as np
from attrs import field, frozen
from attrs.validators import ge, instance_of, le
from numpy.typing import NDArray

from kvpolicy.evict.predictors._validate import as_feature_matrix

__all__ = ["ConstantReturnPredictor"]


def _finite(_inst: object, attribute: object, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"'{getattr(attribute, 'name', '?')}' must be finite: {value!r}")


@frozen
class ConstantReturnPredictor:
    """Predicts the same return and risk for every token.

    Seed 000 (Sec. 6, "Ablation") substitutes a constant return for the MLP and reports
    that it halves the gains: with equal returns the excess value ``g`` of eq. (4) no
    longer separates tokens, so the keep rule falls back to whatever order breaks ties.
    """

    value: float = field(
        default=1.0, converter=float, validator=[instance_of(float), _finite, ge(0.0), le(1.0)]
    )
    """The return R̂ given to every token, in [0, 1]."""
    risk: float = field(
        default=0.0, converter=float, validator=[instance_of(float), _finite, ge(0.0)]
    )
    """The risk σ̂² given to every token, >= 0."""

    def predict(
        self, features: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Return ``(returns, risks)``, both (n,) float64, for (n, k) float64 ``features``."""
        n = as_feature_matrix(features, None).shape[0]
        return np.full(n, self.value), np.full(n, self.risk)
