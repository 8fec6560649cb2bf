"""Synthetic prefix reuse: shared system prompts and follow-up turns of conversations.

The only public trace with prefix information, Mooncake's conversation trace, shows two
kinds of reuse: every request starts with the same 512-token block (a system prompt), and
most requests continue an earlier one (a conversation's next turn re-sends its history),
so the hits lie in the leading prefix. :class:`PrefixSharing` models both, per tenant:

* each tenant has one system prompt of ``system_prompt_len`` tokens that all its requests
  start with (a request shorter than it shares its first ``prompt_len`` tokens);
* with probability ``follow_up_probability`` a request is the next turn of a conversation:
  it continues the longest of the tenant's ``session_window`` most recent requests whose
  prompt is no longer than its own, and shares that parent's whole prompt, system prompt
  included, as a chat client re-sends the history. If no recent request is short enough,
  the request starts a new conversation.

Lengths stay those the length distribution drew, so a calibrated length law is kept; the
model only decides *which* tokens are shared. Hashes are chained prefix hashes of
``block_size``-token blocks: a block is shared only if all the tokens up to its end are.
"""

from __future__ import annotations

import math

import numpy as np
from attrs import field, frozen
from attrs.validators import ge, instance_of, le

from kvpolicy.sim.workloads._mooncake import _mix

__all__ = ["PrefixSharing", "assign_prefix_hashes"]

_SYSTEM_SALT = 0x5EED_5EED
_UNIQUE_SALT = 0x0DD_F00D


def _probability(_inst: object, _attr: object, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"'follow_up_probability' must be a number: {value!r}")
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"'follow_up_probability' must be in [0, 1]: {value!r}")


@frozen
class PrefixSharing:
    """How synthetic requests share prompt prefixes (see the module docstring)."""

    system_prompt_len: int = field(default=0, validator=[instance_of(int), ge(0)])
    """Tokens of each tenant's system prompt, shared by all its requests."""
    follow_up_probability: float = field(default=0.0, validator=_probability)
    """Chance that a request continues one of its tenant's recent requests."""
    session_window: int = field(default=64, validator=[instance_of(int), ge(1)])
    """How many of the tenant's most recent requests a follow-up may continue."""
    block_size: int = field(default=16, validator=[instance_of(int), ge(1), le(1 << 16)])
    """Tokens per hashed block (the simulator's KV block size)."""


def assign_prefix_hashes(
    prompt_lens: np.ndarray,
    tenant_index: np.ndarray,
    sharing: PrefixSharing,
    rng: np.random.Generator,
) -> list[tuple[int, ...]]:
    """Chained block hashes for requests in arrival order.

    Args:
        prompt_lens: (n,) int64 prompt lengths, in arrival order.
        tenant_index: (n,) int64 tenant of each request.
        sharing: the reuse model.
        rng: the generator's random state.

    Returns:
        ``n`` tuples of ``prompt_len // block_size`` int hashes.
    """
    bs = sharing.block_size
    n = int(prompt_lens.size)
    follow = rng.random(n) < sharing.follow_up_probability
    system_cache: dict[int, list[int]] = {}
    recent: dict[int, list[int]] = {}
    out: list[tuple[int, ...]] = []
    for i in range(n):
        p, tenant = int(prompt_lens[i]), int(tenant_index[i])
        blocks = p // bs
        history = recent.setdefault(tenant, [])
        # A conversation's next turn re-sends the history: its parent is a recent request
        # of the tenant with a prompt no longer than its own, whose whole prompt it shares.
        parents = [j for j in history if prompt_lens[j] <= p] if follow[i] else []
        if parents:
            parent = max(parents, key=lambda j: (int(prompt_lens[j]), j))
            inherited = list(out[parent])
        else:
            system = system_cache.get(tenant)
            sys_blocks = sharing.system_prompt_len // bs
            if system is None:
                base = np.full(sys_blocks, _SYSTEM_SALT + tenant, dtype=np.uint64)
                system = _mix(base, np.arange(sys_blocks, dtype=np.uint64)).tolist()
                system_cache[tenant] = system
            inherited = system[: min(p, sharing.system_prompt_len) // bs]
        fresh = blocks - len(inherited)
        if fresh > 0:
            base = np.full(fresh, (_UNIQUE_SALT << 32) + i, dtype=np.uint64)
            idx = np.arange(len(inherited), blocks, dtype=np.uint64)
            inherited.extend(_mix(base, idx).tolist())
        out.append(tuple(inherited))
        history.append(i)
        if len(history) > sharing.session_window:
            del history[0]
    return out
