"""Exceptions of kvpolicy-tiers."""

from __future__ import annotations

__all__ = ["TiersError", "UnknownTierError"]


class TiersError(Exception):
    """Base class of every error kvpolicy-tiers raises on misuse."""


class UnknownTierError(TiersError, ValueError):
    """A tier preset name that is not known; the message lists the known names."""
