"""Exceptions of kvpolicy-sim."""

from __future__ import annotations

__all__ = ["ConfigError", "SimError"]


class SimError(Exception):
    """Base class of every error kvpolicy-sim raises on misuse."""


class ConfigError(SimError, ValueError):
    """A configuration that cannot run: unknown key or name, or no request fits in memory."""
