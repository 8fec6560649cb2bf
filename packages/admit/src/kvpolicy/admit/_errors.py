"""Exceptions of kvpolicy-admit.

Misuse raises ``ValueError`` or ``TypeError`` naming the argument; :class:`AdmitError` is the
base of the errors that come from the computation itself.
"""

from __future__ import annotations

__all__ = ["AdmitError", "RootFindingError"]


class AdmitError(Exception):
    """Base class of the errors raised by kvpolicy.admit."""


class RootFindingError(AdmitError):
    """A polynomial root could not be located to the requested accuracy."""
