"""The public surface of kvpolicy.tiers is exactly its ``__all__``."""

from __future__ import annotations

import kvpolicy.tiers as pkg


def test_all_is_sorted_and_complete() -> None:
    """Every public name is in __all__, every __all__ name exists, and __all__ is unique."""
    public = {n for n in dir(pkg) if not n.startswith("_")} - {"annotations"}
    exported = set(pkg.__all__) - {"__version__"}
    submodules = {n for n in public if type(getattr(pkg, n)).__name__ == "module"}
    assert public - submodules == exported
    assert len(pkg.__all__) == len(set(pkg.__all__))
    assert all(hasattr(pkg, n) for n in pkg.__all__)


def test_version_is_a_string() -> None:
    """The package reports a PEP 440 version."""
    assert pkg.__version__.count(".") == 2
