"""Exceptions of kvpolicy-kvmodel."""

from __future__ import annotations

__all__ = ["BlockPoolError", "KVModelError", "UnknownPresetError"]


class KVModelError(Exception):
    """Base class of every error kvpolicy-kvmodel raises on misuse."""


class BlockPoolError(KVModelError):
    """Misuse of a :class:`BlockPool`: double free, unknown request, write to a shared block."""


class UnknownPresetError(KVModelError, ValueError):
    """A preset name (model or GPU) that is not known; the message lists the known names."""
