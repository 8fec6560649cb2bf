"""The public surface of kvpolicy.vllm is exactly its ``__all__``."""

from __future__ import annotations

import pytest

import kvpolicy.vllm as pkg


def test_all_is_sorted_and_complete() -> None:
    """Every public name is in __all__, every __all__ name exists, and __all__ is unique."""
    lazy = set(pkg._LAZY)
    eager = {n for n in dir(pkg) if not n.startswith("_")} - {"annotations", "Any"} - lazy
    submodules = {n for n in eager if type(getattr(pkg, n)).__name__ == "module"}
    assert (eager - submodules) | lazy == set(pkg.__all__) - {"__version__"}
    assert len(pkg.__all__) == len(set(pkg.__all__))
    assert all(hasattr(pkg, n) for n in set(pkg.__all__) - lazy)


@pytest.mark.usefixtures("needs_vllm")
def test_lazy_names_resolve_with_vllm() -> None:
    """The vLLM-facing names import once vLLM is there."""
    assert all(hasattr(pkg, n) for n in pkg._LAZY)


def test_version_is_a_string() -> None:
    """The package reports a PEP 440 version."""
    assert pkg.__version__.count(".") == 2
