"""kvpolicy-kernels."""

from __future__ import annotations

from kvpolicy.kernels.__about__ import __version__

__all__ = ["__version__"]
