"""Exceptions of kvpolicy-tenancy."""

from __future__ import annotations

__all__ = ["ManifestError", "TenancyError", "UnknownRequestError"]


class TenancyError(Exception):
    """Base class of every error kvpolicy-tenancy raises on misuse."""


class ManifestError(TenancyError, ValueError):
    """A token-pool manifest that cannot be read: unknown key, missing key, wrong value."""


class UnknownRequestError(TenancyError, LookupError):
    """A release of a request the gate does not hold (never admitted, or released twice)."""
