"""Exceptions of kvpolicy-evict."""

from __future__ import annotations

__all__ = ["EvictError"]


class EvictError(Exception):
    """Base class of every error kvpolicy-evict raises on misuse."""
