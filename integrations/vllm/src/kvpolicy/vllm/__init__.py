"""kvpolicy-vllm."""

from __future__ import annotations

from kvpolicy.vllm.__about__ import __version__

__all__ = ["__version__"]
