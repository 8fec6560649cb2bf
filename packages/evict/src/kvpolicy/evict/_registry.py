"""Token policies by name, for command lines and configuration files."""

from __future__ import annotations

from typing import Any

from kvpolicy.evict._baselines import FIFOPolicy, H2OPolicy, LRUPolicy, SinkWindowPolicy
from kvpolicy.evict._errors import UnknownPolicyError
from kvpolicy.evict._table import ScoredPolicy
from kvpolicy.evict._tokenpd import TokenPDConfig, TokenPDPolicy

__all__ = ["POLICY_NAMES", "make_policy"]

POLICY_NAMES: tuple[str, ...] = ("fifo", "lru", "h2o", "sink-window", "token-pd")
"""Names :func:`make_policy` knows."""


def make_policy(name: str, **kwargs: Any) -> ScoredPolicy:
    """Build a token policy by name.

    Args:
        name: one of :data:`POLICY_NAMES`.
        **kwargs: the policy's constructor arguments. For ``"token-pd"`` either
            ``config=TokenPDConfig(...)`` or the fields of :class:`TokenPDConfig`.
            ``"h2o"`` needs ``recent_window``.

    Raises:
        UnknownPolicyError: (a ValueError) ``name`` is not known; the message lists them.
        TypeError: ``name`` is not a str, or an argument the policy does not take.
    """
    if not isinstance(name, str):
        raise TypeError(f"'name' must be str: {name!r}")
    if name == "fifo":
        return FIFOPolicy(**kwargs)
    if name == "lru":
        return LRUPolicy(**kwargs)
    if name == "h2o":
        return H2OPolicy(**kwargs)
    if name == "sink-window":
        return SinkWindowPolicy(**kwargs)
    if name == "token-pd":
        if "config" in kwargs:
            return TokenPDPolicy(**kwargs)
        return TokenPDPolicy(TokenPDConfig(**kwargs))
    known = ", ".join(POLICY_NAMES)
    raise UnknownPolicyError(f"'name' must be one of {known}: {name!r}")
