"""Input checks shared by the modules of kvpolicy-tiers."""

from __future__ import annotations

from collections.abc import Sequence


def is_sequence(value: object) -> bool:
    """True for a list/tuple-like sequence, False for strings, bytes and non-sequences."""
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)
