"""kvpolicy-sim."""

from __future__ import annotations

from kvpolicy.sim.__about__ import __version__

__all__ = ["__version__"]
