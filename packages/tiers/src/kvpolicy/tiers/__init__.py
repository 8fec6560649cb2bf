"""kvpolicy-tiers."""

from __future__ import annotations

from kvpolicy.tiers.__about__ import __version__

__all__ = ["__version__"]
