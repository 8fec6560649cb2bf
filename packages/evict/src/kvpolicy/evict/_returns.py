"""The return-predictor contract Token-PD consumes (seed 000, Sec. 4)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

__all__ = ["ReturnPredictor"]


@runtime_checkable
class ReturnPredictor(Protocol):
    """Maps per-token features to an expected return and a risk.

    Seed 000's predictor is a one-hidden-layer MLP on next-token logits; any callable that
    turns features into ``(R_hat, sigma_hat^2)`` fits. Stack the two outputs as the columns
    of the ``signals`` given to :meth:`TokenPDPolicy.insert`.
    """

    def predict(
        self, features: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Predict returns and risks.

        Args:
            features: (n, k) float64 per-token features.

        Returns:
            ``(returns, risks)``: (n,) float64 expected future attention mass ``R_hat``
            (>= 0) and (n,) float64 risk ``sigma_hat^2`` (>= 0).
        """
        ...
