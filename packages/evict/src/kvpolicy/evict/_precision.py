"""Precision states of a token and the knapsack with several choices per token.

A resident token is held at one of a few precisions (bits per K/V element: 16, 8, 4, 2) or
is evicted (state 0). Each state has a byte cost (kvmodel's ``quantized_token_bytes``,
scales and zero points included) and keeps part of the token's return: a token whose K/V
carry a relative error ``e`` passes on about ``(1 - e)`` of what its attention contributes,
and round-to-nearest at ``b`` bits leaves an error of the order of ``1 / (2**b - 1)`` of a
group's range (:func:`retained_fraction`). Choosing a state per token under one budget in
bytes is a multiple-choice knapsack (:func:`choose_states`); its LP relaxation has one dual
variable, the price of a byte, which decides across every stream at once: seed 000's
token-as-asset view with the cost of a token made a choice instead of a constant (its
outlook asks for a vector of prices over states; the states here share one price per byte).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping

import numpy as np
from attrs import field, frozen
from numpy.typing import NDArray

from kvpolicy.kvmodel import KV_PRECISIONS, ModelSpec, quantized_token_bytes

__all__ = [
    "EVICTED",
    "PRECISIONS",
    "PrecisionCosts",
    "StateChoice",
    "check_precisions",
    "choose_states",
    "retained_fraction",
]

EVICTED = 0
"""The state of an evicted token (0 bits, 0 bytes)."""

PRECISIONS: tuple[int, ...] = KV_PRECISIONS
"""Bits a resident token may be held at: 16 (fp16/bf16), 8, 4, 2."""


def check_precisions(precisions: Iterable[object]) -> tuple[int, ...]:
    """``precisions`` as a tuple of distinct bits, highest first.

    Raises:
        TypeError: an entry is not an int.
        ValueError: empty, repeated, or an entry not in :data:`PRECISIONS` (named).
    """
    if isinstance(precisions, str | bytes):
        raise TypeError(f"'precisions' must be a sequence of ints: {precisions!r}")
    out = []
    for p in precisions:
        if isinstance(p, bool) or not isinstance(p, int | np.integer):
            raise TypeError(f"'precisions' entries must be ints: {p!r}")
        if int(p) not in PRECISIONS:
            raise ValueError(f"'precisions' entries must be among {list(PRECISIONS)}: {p!r}")
        out.append(int(p))
    if not out:
        raise ValueError("'precisions' must name at least one precision")
    if len(set(out)) != len(out):
        raise ValueError(f"'precisions' must be distinct: {out!r}")
    return tuple(sorted(out, reverse=True))


def retained_fraction(bits: int, loss_scale: float) -> float:
    """The share of its return a token keeps when held at ``bits``: 1 at 16 bits, 0 when
    evicted, ``max(0, 1 - loss_scale / (2**bits - 1))`` in between.

    Round-to-nearest over a group of range ``r`` errs by at most ``r / (2 (2**b - 1))``
    per element and by ``r / (sqrt(12) (2**b - 1))`` in RMS; relative to the RMS of the
    elements (a group of 32 Gaussian-like entries spans about 4-5 of them) that is about
    ``1.3 / (2**b - 1)``, so ``loss_scale`` near 1 reads as "the relative error of the K/V
    is the share of the return lost" (``0.1`` at 4 bits, ``0.005`` at 8).

    Raises:
        ValueError: ``bits`` not 0 or in :data:`PRECISIONS`, or ``loss_scale`` < 0 or not finite.
    """
    if bits != EVICTED and bits not in PRECISIONS:
        raise ValueError(f"'bits' must be 0 or one of {list(PRECISIONS)}: {bits!r}")
    if not math.isfinite(loss_scale) or loss_scale < 0:
        raise ValueError(f"'loss_scale' must be finite and >= 0: {loss_scale!r}")
    if bits == EVICTED:
        return 0.0
    if bits == 16:
        return 1.0
    return max(0.0, 1.0 - float(loss_scale) / float(2**bits - 1))


def _check_bytes(value: Mapping[int, float]) -> dict[int, float]:
    out = {}
    for bits, cost in dict(value).items():
        if bits not in PRECISIONS:
            raise ValueError(f"'token_bytes' keys must be among {list(PRECISIONS)}: {bits!r}")
        c = float(cost)
        if not math.isfinite(c) or c <= 0:
            raise ValueError(f"'token_bytes' of {bits} bits must be finite and > 0: {cost!r}")
        out[int(bits)] = c
    if not out:
        raise ValueError("'token_bytes' must give at least one precision's cost")
    ordered = sorted(out)
    for lo, hi in itertools.pairwise(ordered):
        if out[lo] >= out[hi]:
            raise ValueError(
                f"'token_bytes' must grow with the bits: {lo} bits cost {out[lo]}, "
                f"{hi} bits {out[hi]}"
            )
    return out


@frozen
class PrecisionCosts:
    """Bytes of one token of one stream at each precision (0 bits: 0 bytes)."""

    token_bytes: Mapping[int, float] = field(converter=_check_bytes)
    """``{bits: bytes}`` for each precision a token may be held at; grows with the bits."""

    @classmethod
    def of(
        cls,
        spec: ModelSpec,
        precisions: Iterable[int] = PRECISIONS,
        group_size: int = 32,
        scale_bytes: int = 2,
    ) -> PrecisionCosts:
        """The costs of a token of ``spec`` (every layer and KV head; for one layer's
        stream pass a spec with ``num_layers=1``) from kvmodel's ``quantized_token_bytes``."""
        bits = check_precisions(precisions)
        return cls({b: quantized_token_bytes(spec, b, group_size, scale_bytes) for b in bits})

    @property
    def precisions(self) -> tuple[int, ...]:
        """The precisions priced, highest first."""
        return tuple(sorted(self.token_bytes, reverse=True))

    def cost(self, bits: NDArray[np.int64]) -> NDArray[np.float64]:
        """(n,) float64 bytes of tokens held at (n,) int64 ``bits`` (0: evicted).

        Raises:
            ValueError: a precision without a cost.
        """
        b = np.asarray(bits, dtype=np.int64)
        out = np.zeros(b.shape, dtype=np.float64)
        known = b == EVICTED
        for p, c in self.token_bytes.items():
            hit = b == p
            out[hit] = c
            known |= hit
        if not known.all():
            raise ValueError(
                f"no cost for precision {int(b[~known][0])}: {sorted(self.token_bytes)}"
            )
        return out


@frozen
class StateChoice:
    """What :func:`choose_states` chose."""

    state: NDArray[np.int64] = field(eq=False)
    """(n,) int64 index of each token's state (a column of ``values``)."""
    price: float = field()
    """The price of a byte: the value per byte of the first upgrade left out (0 when every
    upgrade fits), the dual variable of the budget in the LP relaxation."""
    spent: float = field()
    """Bytes the chosen states cost."""


def choose_states(
    values: NDArray[np.float64],
    costs: NDArray[np.float64],
    budget: float,
    available: NDArray[np.bool_] | None = None,
    priority: NDArray[np.float64] | None = None,
) -> StateChoice:
    """The multiple-choice knapsack by its LP-greedy: one state per token, one price per byte.

    Column 0 is the free state (evicted: cost 0); the others cost more from left to right.
    For each token the states on the upper concave hull of ``(cost, value)`` form a chain
    of *upgrades* whose value per byte falls along the chain; the upgrades of every token
    are taken in order of value per byte, best first, while the bytes fit. That is the
    optimum of the LP relaxation rounded down (at most one upgrade short of it), and the
    value per byte of the first upgrade left out is the price that clears the budget:
    every token sits in the state that maximises ``value - price * cost``.

    Args:
        values: (n, S) float64 value of each token in each state (column 0 usually 0).
        costs: (S,) float64 bytes of a token in each state, ``costs[0] == 0`` and
            increasing.
        budget: bytes available, >= 0.
        available: (n, S) bool, which states a token may take (column 0 must be True);
            None: all.
        priority: (n,) float64, which upgrades go first among equal value per byte (larger
            first; e.g. newer tokens); None: lower index first.

    Returns:
        Each token's state, the price, the bytes spent.

    Raises:
        ValueError: shapes disagree, costs not increasing from 0, a value not finite, a
            negative budget, or the free state unavailable.
    """
    v = np.asarray(values, dtype=np.float64)
    c = np.asarray(costs, dtype=np.float64)
    if v.ndim != 2 or c.shape != (v.shape[1],) or v.shape[1] < 1:
        raise ValueError(f"'values' must be (n, S) and 'costs' (S,): {v.shape}, {c.shape}")
    if c[0] != 0 or np.any(np.diff(c) <= 0):
        raise ValueError(f"'costs' must start at 0 and increase: {c.tolist()}")
    if not np.isfinite(v).all():
        raise ValueError("'values' must be finite")
    if not math.isfinite(budget) or budget < 0:
        raise ValueError(f"'budget' must be finite and >= 0: {budget!r}")
    n, s = v.shape
    avail = np.ones((n, s), dtype=bool) if available is None else np.asarray(available, bool)
    if avail.shape != (n, s) or not avail[:, 0].all():
        raise ValueError("'available' must be (n, S) with the free state (column 0) True")
    order_key = np.zeros(n) if priority is None else np.asarray(priority, dtype=np.float64)
    # Walk each token's upper hull from the free state: the next vertex is the dearer
    # available state of steepest slope (the dearest among equal slopes).
    cur = np.zeros(n, dtype=np.int64)
    rows = np.arange(n)
    tok, to, dc, eff, step = [], [], [], [], []
    for k in range(s - 1):
        dv = v - v[rows, cur][:, None]
        dcost = c[None, :] - c[cur][:, None]
        ok = avail & (dcost > 0)
        slope = np.where(ok, dv / np.where(ok, dcost, 1.0), -np.inf)
        # argmax of the reversed columns prefers the dearest state among equal slopes.
        best = s - 1 - np.argmax(slope[:, ::-1], axis=1)
        best_slope = slope[rows, best]
        go = np.isfinite(best_slope) & (best_slope >= 0)
        if not go.any():
            break
        idx = rows[go]
        tok.append(idx)
        to.append(best[go])
        dc.append(c[best[go]] - c[cur[go]])
        eff.append(best_slope[go])
        step.append(np.full(idx.size, k))
        cur = np.where(go, best, cur)
    state = np.zeros(n, dtype=np.int64)
    if not tok:
        return StateChoice(state=state, price=0.0, spent=0.0)
    t, dest = np.concatenate(tok), np.concatenate(to)
    d, e, st = np.concatenate(dc), np.concatenate(eff), np.concatenate(step)
    # Best value per byte first; a token's own upgrades stay in chain order (their slopes
    # fall along the hull, equal slopes by step); then priority, then index.
    order = np.lexsort((t, -order_key[t], st, -e))
    spent = np.cumsum(d[order])
    taken = int(np.searchsorted(spent, budget, side="right"))
    chosen = order[:taken]
    # A token's states grow along its chain: the dearest upgrade taken is where it ends.
    np.maximum.at(state, t[chosen], dest[chosen])
    price = float(e[order[taken]]) if taken < order.size else 0.0
    return StateChoice(state=state, price=price, spent=float(spent[taken - 1]) if taken else 0.0)
