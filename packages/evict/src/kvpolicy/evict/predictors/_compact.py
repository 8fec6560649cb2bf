"""A compact return predictor from cheap per-token signals, in numpy.

Seed 000 (Sec. 4) predicts a token's return from the full next-token logits with an MLP of
``|V| * 256`` weights. Most of what such a model can learn about future attention is
carried by a handful of scalars that the decoder already has when a token enters the
cache: how uncertain the next-token distribution is (entropy, top probability), where the
token sits (attention sinks live at the first positions), and how much attention it drew
on arrival. :class:`CompactReturnPredictor` regresses ``log R`` on a fixed basis of those
signals (ridge least squares), so it has a dozen weights and runs in microseconds.

Raw features, one row per token, columns in :data:`COMPACT_FEATURES` order::

    0 entropy         nats of softmax(logits) at the token's step
    1 top_prob        max softmax probability at that step
    2 position        the token's absolute position (0 = first)
    3 attention       attention mass the token received on arrival (mean over heads/layers)
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Iterable
from typing import Any, SupportsFloat

import numpy as np
from attrs import field, frozen
from attrs.validators import deep_iterable, ge, instance_of
from numpy.typing import NDArray

from kvpolicy.evict.predictors._validate import as_feature_matrix

__all__ = [
    "COMPACT_FEATURES",
    "CompactReturnPredictor",
    "compact_features",
    "fit_compact",
    "load_compact",
    "save_compact",
]

COMPACT_FEATURES: tuple[str, ...] = ("entropy", "top_prob", "position", "attention")
"""Names of the raw feature columns :class:`CompactReturnPredictor` reads, in order."""

_BASIS = (
    "bias",
    "entropy",
    "top_prob",
    "log1p_position",
    "inv_position",
    "attention",
    "log_attention",
)
_FORMAT = "kvpolicy-compact-return"
_EPS = 1e-6


def _basis(features: NDArray[np.float64]) -> NDArray[np.float64]:
    """(n, 4) raw features -> (n, 7) regression basis (see ``_BASIS``)."""
    entropy, top, pos, att = features.T
    pos = np.maximum(pos, 0.0)
    att = np.clip(att, 0.0, 1.0)
    return np.column_stack(
        [
            np.ones_like(entropy),
            entropy,
            top,
            np.log1p(pos),
            1.0 / (1.0 + pos),
            att,
            np.log(att + _EPS),
        ]
    )


def compact_features(
    logits: NDArray[np.floating], positions: NDArray[np.int64], attention: NDArray[np.floating]
) -> NDArray[np.float64]:
    """Build the raw features of :data:`COMPACT_FEATURES` for n tokens.

    Args:
        logits: (n, vocab_size) float next-token logits at each token's step.
        positions: (n,) int64 absolute positions of the tokens.
        attention: (n,) float attention mass each token received on arrival.

    Returns:
        (n, 4) float64 features.
    """
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 2:
        raise ValueError(f"'logits' must be 2-D (n, vocab_size): shape {z.shape}")
    pos = np.asarray(positions)
    att = np.asarray(attention, dtype=np.float64)
    if pos.shape != (z.shape[0],) or att.shape != (z.shape[0],):
        raise ValueError(
            f"'positions' and 'attention' must be ({z.shape[0]},): {pos.shape}, {att.shape}"
        )
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    entropy = -(p * np.log(np.maximum(p, 1e-300))).sum(axis=1)
    return np.column_stack([entropy, p.max(axis=1), pos.astype(np.float64), att])


def _to_floats(values: Iterable[SupportsFloat]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def _weights_ok(_inst: object, _attribute: object, value: tuple[float, ...]) -> None:
    if len(value) != len(_BASIS):
        raise ValueError(
            f"'weights' must have {len(_BASIS)} entries ({', '.join(_BASIS)}): {len(value)}"
        )
    if not all(math.isfinite(w) for w in value):
        raise ValueError(f"'weights' must be finite: {value!r}")


@frozen
class CompactReturnPredictor:
    """Log-linear return model on a basis of cheap signals, with lognormal risk.

    ``log R = w · φ(features) + ε``, ``ε ~ N(0, s²)``; the prediction is the lognormal
    mean ``R̂ = exp(w·φ + s²/2)`` clipped to [0, 1], and the risk its variance
    ``σ̂² = (exp(s²) - 1) · exp(2 w·φ + s²)`` (the σ² of seed 000's eq. (2)).
    """

    weights: tuple[float, ...] = field(
        converter=_to_floats,
        validator=[deep_iterable(instance_of(float)), _weights_ok],
    )
    """One weight per basis function: bias, entropy, top_prob, log1p(position),
    1/(1+position), attention, log(attention)."""
    residual_variance: float = field(default=0.0, converter=float, validator=ge(0.0))
    """s²: variance of ``log R`` around the fit, measured on the training text."""

    def predict(
        self, features: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Predict returns and risks.

        Args:
            features: (n, 4) float64 raw features (:data:`COMPACT_FEATURES`).

        Returns:
            ``(returns, risks)``: (n,) float64 in [0, 1] and (n,) float64 >= 0.
        """
        x = as_feature_matrix(features, len(COMPACT_FEATURES))
        log_mean = _basis(x) @ np.asarray(self.weights)
        s2 = self.residual_variance
        returns = np.exp(np.minimum(log_mean + s2 / 2.0, 0.0))
        risks = np.expm1(s2) * np.exp(np.minimum(2.0 * log_mean + s2, 0.0))
        return returns, risks

    def predict_logits(
        self, logits: Any, positions: Any, attention: Any
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """:meth:`predict` from (n, V) logits, (n,) positions and (n,) arrival attention.

        CUDA logits go through kvpolicy-kernels' fused Triton kernel when it is installed;
        anything else through :func:`compact_features`.
        """
        from kvpolicy.evict._kernels import compact_scores

        return compact_scores(self, logits, positions, attention)


def fit_compact(
    features: NDArray[np.float64], targets: NDArray[np.float64], ridge: float = 1e-3
) -> CompactReturnPredictor:
    """Fit a :class:`CompactReturnPredictor` by ridge least squares on ``log R``.

    Args:
        features: (n, 4) float64 raw features (:data:`COMPACT_FEATURES`).
        targets: (n,) float64 realised returns in [0, 1] (future attention mass).
        ridge: L2 penalty on every weight but the bias, >= 0.

    Returns:
        The fitted predictor; its ``residual_variance`` is the training residual variance.
    """
    x = as_feature_matrix(features, len(COMPACT_FEATURES))
    y = np.asarray(targets, dtype=np.float64)
    if y.shape != (x.shape[0],):
        raise ValueError(f"'targets' must have shape ({x.shape[0]},): {y.shape}")
    if x.shape[0] < len(_BASIS):
        raise ValueError(f"'features' needs at least {len(_BASIS)} rows to fit: {x.shape[0]}")
    if not np.isfinite(y).all() or (y < 0).any() or (y > 1).any():
        raise ValueError("'targets' must be finite and in [0, 1]")
    if not (math.isfinite(ridge) and ridge >= 0):
        raise ValueError(f"'ridge' must be finite and >= 0: {ridge!r}")
    phi = _basis(x)
    # Standardise the non-bias columns so one ridge value means the same for each.
    mu = phi[:, 1:].mean(axis=0)
    sd = phi[:, 1:].std(axis=0)
    sd[sd == 0] = 1.0
    z = np.column_stack([np.ones(len(phi)), (phi[:, 1:] - mu) / sd])
    logy = np.log(np.maximum(y, _EPS))
    penalty = ridge * len(z) * np.eye(z.shape[1])
    penalty[0, 0] = 0.0
    beta = np.linalg.solve(z.T @ z + penalty, z.T @ logy)
    w = np.empty_like(beta)
    w[1:] = beta[1:] / sd
    w[0] = beta[0] - float((beta[1:] * mu / sd).sum())
    resid = logy - phi @ w
    return CompactReturnPredictor(weights=tuple(w), residual_variance=float(resid.var()))


def save_compact(predictor: CompactReturnPredictor, path: str | pathlib.Path) -> None:
    """Write ``predictor`` to ``path`` as a small JSON checkpoint."""
    doc = {
        "format": _FORMAT,
        "features": list(COMPACT_FEATURES),
        "basis": list(_BASIS),
        "weights": list(predictor.weights),
        "residual_variance": predictor.residual_variance,
    }
    pathlib.Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def load_compact(path: str | pathlib.Path) -> CompactReturnPredictor:
    """Read a checkpoint written by :func:`save_compact`.

    Raises:
        ValueError: not a compact-predictor checkpoint, or weights of the wrong shape.
    """
    try:
        doc = json.loads(pathlib.Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"'path' is not a JSON checkpoint: {path} ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise ValueError(f"'path' is not a {_FORMAT} checkpoint: {path}")
    weights = doc.get("weights")
    if not isinstance(weights, list) or len(weights) != len(_BASIS):
        got = len(weights) if isinstance(weights, list) else type(weights).__name__
        raise ValueError(
            f"checkpoint {path} has weights of shape ({got},), expected ({len(_BASIS)},)"
        )
    if doc.get("features") != list(COMPACT_FEATURES):
        raise ValueError(
            f"checkpoint {path} reads features {doc.get('features')}, "
            f"expected {list(COMPACT_FEATURES)}"
        )
    return CompactReturnPredictor(
        weights=tuple(weights), residual_variance=float(doc.get("residual_variance", 0.0))
    )
