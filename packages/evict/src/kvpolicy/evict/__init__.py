"""kvpolicy-evict."""

from __future__ import annotations

from kvpolicy.evict.__about__ import __version__

__all__ = ["__version__"]
