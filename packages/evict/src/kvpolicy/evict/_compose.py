"""Eviction policies composed into one (kvpress's ``ComposedPress`` for a batch-global budget).

The members of a :class:`Composed` policy hold the same resident tokens: each is told of
every insert, observation and removal, and learns by its own rule. Their keys live on
different scales (H2O's accumulated attention, Token-PD's excess value, LRU's clock), so
they are never compared: a round is a sequence of *successive rounds*, one per member, each
choosing by its own keys among the tokens the previous ones left, and each taking its share
of the excess::

    excess X = resident - budget            shares w_1 .. w_k (sum 1)

    member 1 evicts down to  resident - floor(X * w_1)
    member 2 evicts down to  resident - floor(X * (w_1 + w_2))      (over what 1 left)
    ...
    member k evicts down to  budget                                   (exactly the budget)

and the tokens one member evicts leave every other member at once (:meth:`rollback`), so
the next member chooses only among tokens still resident. A member may evict more than its
share by its own rule (Token-PD's keep rule); the later members then have less to do. With
no excess every member still runs its round at the budget, as it would alone (Token-PD
updates its price, its keep rule may evict).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from kvpolicy.evict._table import check_budget
from kvpolicy.kvmodel import EVICTION, EvictionPolicy, Scheduled, build

__all__ = ["Composed", "Discarding", "compose"]


@runtime_checkable
class Discarding(Protocol):
    """An eviction policy that can forget given resident positions of a stream (evicted by
    another policy), as every :class:`~kvpolicy.evict.ScoredPolicy` does."""

    def rollback(self, stream: str, positions: NDArray[np.int64]) -> None:
        """Forget resident ``positions`` ((n,) int64) of ``stream`` at once."""
        ...


def _shares(shares: Sequence[float] | None, k: int) -> tuple[float, ...]:
    if shares is None:
        return (1.0 / k,) * k
    if isinstance(shares, str | bytes) or not isinstance(shares, Sequence):
        raise TypeError(f"'shares' must be a sequence of floats: {shares!r}")
    if len(shares) != k:
        raise ValueError(f"'shares' must have one entry per policy ({k}): {list(shares)!r}")
    out = []
    for w in shares:
        if isinstance(w, bool) or not isinstance(w, int | float):
            raise TypeError(f"'shares' must hold floats: {w!r}")
        if not w > 0.0 or w == float("inf"):
            raise ValueError(f"'shares' must be > 0 and finite: {w!r}")
        out.append(float(w))
    total = sum(out)
    return tuple(w / total for w in out)


class Composed:
    """Several eviction policies as one: successive rounds, each its share of the excess.

    ``Composed([H2OPolicy(), TokenPDPolicy()])`` evicts half of each round's excess by
    H2O's heavy-hitter scores and the rest by Token-PD's value among the tokens H2O left;
    see the module docstring for the exact rule. It implements kvmodel's
    ``EvictionPolicy``, so it composes further and goes wherever a policy goes; give it a
    cadence from outside, ``Periodic(Composed([...]), interval)``.

    Args:
        policies: two or more fresh policies (no token inserted yet), in the order their
            rounds run; each must forget positions on request (:class:`Discarding`, e.g. any
            :class:`~kvpolicy.evict.ScoredPolicy`) and none may have a cadence of its own.
        shares: the fraction of each round's excess each member evicts, one per policy,
            > 0 (normalised to sum to 1); None gives every member an equal share.

    Raises:
        TypeError: a member is not an ``EvictionPolicy`` that can forget positions, or a
            share is not a number.
        ValueError: fewer than two policies, the same object twice, a member holding
            tokens or with a cadence (``Periodic``), or a share <= 0.
    """

    def __init__(
        self, policies: Sequence[EvictionPolicy], shares: Sequence[float] | None = None
    ) -> None:
        if not isinstance(policies, Sequence):
            raise TypeError(f"'policies' must be a sequence of EvictionPolicy: {policies!r}")
        members = list(policies)
        if len(members) < 2:
            raise ValueError(f"'policies' must hold at least two policies: {len(members)}")
        discarding: list[Discarding] = []
        for p in members:
            if not isinstance(p, EvictionPolicy):
                raise TypeError(f"'policies' must hold EvictionPolicy objects: {p!r}")
            if isinstance(p, Scheduled):
                raise ValueError(
                    f"'policies' member {p!r} has a cadence of its own, which a composition "
                    "never ticks: put the cadence outside, Periodic(Composed([...]), interval)"
                )
            if not isinstance(p, Discarding):
                raise TypeError(
                    f"'policies' member {p!r} cannot forget positions another member evicts "
                    "(it needs rollback(stream, positions), as every ScoredPolicy has)"
                )
            if p.resident_tokens():
                raise ValueError(f"'policies' member {p!r} must hold no tokens yet")
            discarding.append(p)
        if len({id(p) for p in members}) != len(members):
            raise ValueError("'policies' holds the same policy object twice")
        self._members: tuple[EvictionPolicy, ...] = tuple(members)
        self._discard: tuple[Discarding, ...] = tuple(discarding)  # the same objects
        self._shares = _shares(shares, len(members))

    def __repr__(self) -> str:
        inner = ", ".join(repr(p) for p in self._members)
        return f"Composed([{inner}], shares={list(self._shares)})"

    @property
    def policies(self) -> tuple[EvictionPolicy, ...]:
        """The members, in the order their rounds run."""
        return self._members

    @property
    def shares(self) -> tuple[float, ...]:
        """Each member's fraction of a round's excess (they sum to 1)."""
        return self._shares

    def insert(
        self,
        stream: str,
        positions: NDArray[np.int64],
        signals: NDArray[np.float64] | None = None,
    ) -> None:
        """Add tokens to every member (the same signals to each).

        Raises:
            TypeError, ValueError: a member rejects the tokens or their signals; the
                members that took them forget them again, so nothing changes.
        """
        done = 0
        try:
            for p in self._members:
                p.insert(stream, positions, signals)
                done += 1
        except Exception:
            pos = np.asarray(positions, dtype=np.int64)
            for q in self._discard[:done]:
                q.rollback(stream, pos)
            raise

    def observe(
        self, stream: str, positions: NDArray[np.int64], attention: NDArray[np.float64]
    ) -> None:
        """Record attention in every member (each learns by its own rule)."""
        for p in self._members:
            p.observe(stream, positions, attention)

    def evict(self, budget_tokens: int) -> Mapping[str, NDArray[np.int64]]:
        """Successive rounds down to ``budget_tokens``, one per member (see the class).

        Returns:
            For each stream that lost tokens, its (m,) int64 evicted positions, ascending.

        Raises:
            TypeError, ValueError: ``budget_tokens`` is not an int >= 0.
        """
        budget = check_budget(budget_tokens)
        members, discard = self._members, self._discard
        start = members[0].resident_tokens()
        excess = max(0, start - budget)
        lost: dict[str, list[NDArray[np.int64]]] = {}
        share = 0.0
        for i, p in enumerate(members):
            share += self._shares[i]
            last = i == len(members) - 1
            target = budget if last else start - int(excess * share)
            evicted = p.evict(target)
            for stream, pos in evicted.items():
                if not len(pos):
                    continue
                lost.setdefault(stream, []).append(pos)
                for j, other in enumerate(discard):
                    if j != i:
                        other.rollback(stream, pos)
        return {
            s: parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts))
            for s, parts in lost.items()
        }

    def rollback(self, stream: str, positions: NDArray[np.int64]) -> None:
        """Forget resident ``positions`` of ``stream`` in every member (so that a
        composition composes)."""
        for p in self._discard:
            p.rollback(stream, positions)

    def remove(self, stream: str) -> None:
        """Forget a stream in every member."""
        for p in self._members:
            p.remove(stream)

    def resident_tokens(self) -> int:
        """Tokens resident across every stream (the same in every member)."""
        return self._members[0].resident_tokens()


def compose(
    policies: Sequence[str | Mapping[str, Any]], shares: Sequence[float] | None = None
) -> Composed:
    """A :class:`Composed` policy of registered policies, named as in a stack file.

    The ``composed`` entry point of ``kvpolicy.eviction``::

        eviction:
          name: composed
          params:
            policies: [sink-window, {name: token-pd, params: {risk_aversion: 0.2}}]
            shares: [1, 3]

    Args:
        policies: two or more entries, each a ``kvpolicy.eviction`` name or a mapping with
            ``name`` and optional ``params``, built by kvmodel's resolver in order.
        shares: as for :class:`Composed`.

    Raises:
        TypeError / ValueError: an entry that is neither a name nor a mapping with ``name``
            (named by its index), or what :class:`Composed` refuses.
        RegistryError: an unknown name or a bad param of an entry (named).
    """
    if isinstance(policies, str | bytes) or not isinstance(policies, Sequence):
        raise TypeError(f"'policies' must be a list of policy names or mappings: {policies!r}")
    built: list[EvictionPolicy] = []
    for i, entry in enumerate(policies):
        if isinstance(entry, str):
            built.append(build(EVICTION, entry))
            continue
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise TypeError(
                f"'policies[{i}]' must be a policy name or a mapping with 'name': {entry!r}"
            )
        unknown = sorted(set(entry) - {"name", "params"})
        if unknown:
            raise ValueError(f"'policies[{i}]' has unknown keys {unknown}; allowed: name, params")
        built.append(build(EVICTION, entry["name"], entry.get("params")))
    return Composed(built, shares)
