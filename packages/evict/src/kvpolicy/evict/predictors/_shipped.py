"""The compact predictor weights shipped with the package."""

from __future__ import annotations

import pathlib

from kvpolicy.evict.predictors._compact import CompactReturnPredictor, load_compact

__all__ = ["DEFAULT_COMPACT_PATH", "default_compact"]

DEFAULT_COMPACT_PATH = pathlib.Path(__file__).with_name("compact_smollm2.json")
"""Compact predictor fitted on SmolLM2-135M-Instruct attention over the license texts in
/usr/share/common-licenses (see ``kvpolicy evict train``)."""


def default_compact() -> CompactReturnPredictor:
    """Load the shipped compact predictor (:data:`DEFAULT_COMPACT_PATH`)."""
    return load_compact(DEFAULT_COMPACT_PATH)
