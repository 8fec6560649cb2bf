"""Exceptions of kvpolicy-evict."""

from __future__ import annotations

__all__ = ["EvictError", "UnknownPolicyError"]


class EvictError(Exception):
    """Base class of every error kvpolicy-evict raises on misuse."""


class UnknownPolicyError(EvictError, ValueError):
    """A policy name that is not known; the message lists the known names."""
