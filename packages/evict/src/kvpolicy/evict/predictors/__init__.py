"""Return predictors for Token-PD: R̂ (future attention mass) and risk σ̂² per token.

Each implements kvpolicy.evict's ``ReturnPredictor`` Protocol:
``predict(features (n, k) float64) -> ((n,) returns, (n,) risks)``.

- :class:`ConstantReturnPredictor`: one value for every token (seed 000's ablation).
- :class:`CompactReturnPredictor`: log-linear on entropy, top probability, position and
  arrival attention; numpy only; :func:`default_compact` loads the weights shipped with the
  package (fitted on SmolLM2-135M-Instruct over license texts).
- ``LogitsMLPPredictor``: seed 000's |V| -> 256 -> 1 MLP on the logits (needs torch; the
  names ``LogitsMLPPredictor``, ``MLP_HIDDEN``, ``train_mlp``, ``save_mlp`` and
  ``load_mlp`` import torch on first use).
"""

from __future__ import annotations

import importlib
from typing import Any

from kvpolicy.evict.predictors._compact import (
    COMPACT_FEATURES,
    CompactReturnPredictor,
    compact_features,
    fit_compact,
    load_compact,
    save_compact,
)
from kvpolicy.evict.predictors._constant import ConstantReturnPredictor
from kvpolicy.evict.predictors._shipped import DEFAULT_COMPACT_PATH, default_compact

__all__ = [
    "COMPACT_FEATURES",
    "DEFAULT_COMPACT_PATH",
    "MLP_HIDDEN",
    "CompactReturnPredictor",
    "ConstantReturnPredictor",
    "LogitsMLPPredictor",
    "compact_features",
    "default_compact",
    "fit_compact",
    "load_compact",
    "load_mlp",
    "save_compact",
    "save_mlp",
    "train_mlp",
]

_TORCH_NAMES = frozenset({"MLP_HIDDEN", "LogitsMLPPredictor", "load_mlp", "save_mlp", "train_mlp"})


def __getattr__(name: str) -> Any:
    # torch is an optional extra: the MLP names import it only when first used.
    if name in _TORCH_NAMES:
        try:
            module = importlib.import_module("kvpolicy.evict.predictors._mlp")
        except ImportError as exc:
            raise ImportError(
                f"{name} needs torch: pip install --find-links dist --extra-index-url "
                f"https://download.pytorch.org/whl/cpu 'kvpolicy-evict[torch]' ({exc})"
            ) from exc
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _TORCH_NAMES)
