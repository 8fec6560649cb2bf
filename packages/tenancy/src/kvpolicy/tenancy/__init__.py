"""kvpolicy-tenancy."""

from __future__ import annotations

from kvpolicy.tenancy.__about__ import __version__

__all__ = ["__version__"]
