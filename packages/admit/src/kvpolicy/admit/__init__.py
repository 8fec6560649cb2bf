"""kvpolicy-admit."""

from __future__ import annotations

from kvpolicy.admit.__about__ import __version__

__all__ = ["__version__"]
