"""Where one policy loses against another: the positions that make the difference in
perplexity, and how far back the token predicted there last appeared in the text.

Eviction hurts most where the model copies a token it saw long before (an induction
head's job): if that earlier occurrence was evicted, the copy fails. A policy that ranks
tokens by the attention they received cannot foresee such copies when the source was
not attended for hundreds of steps; a recent window keeps them while they are young
enough. ``python -m kvpolicy.evict.quality.losses`` reads two rows of a results file
(``kvpolicy evict eval --out``), re-tokenises the text and prints the positions with the
largest loss difference and the difference summed by copy distance::

    python -m kvpolicy.evict.quality.losses --rows rows.jsonl --text code --budget 0.5 \\
        --policy token-pd:keep_rule=false:memory=32 --against sink-window
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from attrs import frozen
from numpy.typing import NDArray

__all__ = [
    "DISTANCE_BUCKETS",
    "LossSource",
    "SourceAttention",
    "copy_distances",
    "loss_by_distance",
    "loss_sources",
    "main",
    "source_attention",
]

DISTANCE_BUCKETS = (32, 256, 1024)
"""Upper edges of the copy-distance buckets of :func:`loss_by_distance` (tokens); the last
bucket holds longer distances and tokens that never appeared before."""


@frozen
class LossSource:
    """One predicted position and what two policies lost there."""

    position: int
    """Index into the rows' ``nll`` (the token at ``position + 1`` is predicted)."""
    delta: float
    """NLL of the policy minus NLL of the other one (nats; > 0: the policy lost)."""
    distance: int | None
    """Tokens since the predicted token last appeared before it (None: never)."""


@frozen
class SourceAttention:
    """How much attention the earlier occurrence of a copied token received before the
    copy, in a full-cache pass (:func:`source_attention`)."""

    source: int
    """Position of the last earlier occurrence of the predicted token."""
    mean: float
    """Mean attention it received from the queries strictly between it and the copy."""
    uniform: float
    """Mean of ``1 / (q + 1)`` over those queries: what an evenly spread query gives a key."""
    above: float
    """Median over those queries (every 50th) of the share of keys that got more."""
    at_copy: float
    """Attention it received from the query that predicts the copy."""


def source_attention(
    mass: NDArray[np.float64], ids: Sequence[int], position: int
) -> SourceAttention | None:
    """:class:`SourceAttention` of the token predicted at ``position`` (``ids[position + 1]``),
    None when it never appeared before or appeared right before.

    Args:
        mass: (n, n) full-cache attention, ``mass[q, k]`` the share of query ``q`` on key
            ``k`` (``quality.mean_attention``).
        ids: the n token ids.
        position: a predicted position, ``0 <= position < n - 1``.
    """
    target = ids[position + 1]
    earlier = [i for i in range(position + 1) if ids[i] == target]
    if not earlier or earlier[-1] >= position:
        return None
    src = earlier[-1]
    queries = np.arange(src + 1, position)
    between = mass[queries, src]
    above = [float((mass[q, : q + 1] > mass[q, src]).mean()) for q in queries[::50]]
    return SourceAttention(
        source=src,
        mean=float(between.mean()),
        uniform=float(np.mean(1.0 / (queries + 1.0))),
        above=float(np.median(above)),
        at_copy=float(mass[position, src]),
    )


def copy_distances(ids: Sequence[int] | NDArray[np.int64]) -> NDArray[np.int64]:
    """For each predicted position ``p`` (0 .. n - 2), how many tokens before ``p + 1`` the
    token ``ids[p + 1]`` last appeared; -1 where it never appeared before.

    Returns:
        (n - 1,) int64.
    """
    arr = np.asarray(ids, dtype=np.int64)
    last: dict[int, int] = {}
    out = np.full(max(arr.size - 1, 0), -1, dtype=np.int64)
    for i, tok in enumerate(arr.tolist()):
        if i >= 1:
            prev = last.get(tok)
            out[i - 1] = -1 if prev is None else i - prev
        last[tok] = i
    return out


def loss_sources(
    nll: NDArray[np.float64], other: NDArray[np.float64], ids: Sequence[int], top: int
) -> list[LossSource]:
    """The ``top`` positions where ``nll - other`` is largest, with their copy distance.

    Raises:
        ValueError: the arrays differ in length, or do not match ``len(ids) - 1``.
    """
    a, b = _check(nll, other, ids)
    delta = a - b
    dist = copy_distances(ids)
    order = np.argsort(-delta, kind="stable")[: max(top, 0)]
    return [
        LossSource(int(p), float(delta[p]), None if dist[p] < 0 else int(dist[p])) for p in order
    ]


def loss_by_distance(
    nll: NDArray[np.float64], other: NDArray[np.float64], ids: Sequence[int]
) -> list[tuple[str, int, float]]:
    """``(bucket, positions, summed nll - other)`` per copy-distance bucket
    (:data:`DISTANCE_BUCKETS`); the sums add up to the whole difference.

    Raises:
        ValueError: as :func:`loss_sources`.
    """
    a, b = _check(nll, other, ids)
    delta = a - b
    dist = copy_distances(ids)
    far = np.where(dist < 0, np.iinfo(np.int64).max, dist)
    out = []
    lo = 0
    for hi in DISTANCE_BUCKETS:
        sel = (far > lo) & (far <= hi)
        out.append((f"{lo + 1}-{hi}", int(sel.sum()), float(delta[sel].sum())))
        lo = hi
    sel = far > lo
    out.append((f">{lo} or never", int(sel.sum()), float(delta[sel].sum())))
    return out


def _check(
    nll: NDArray[np.float64], other: NDArray[np.float64], ids: Sequence[int]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    a = np.asarray(nll, dtype=np.float64)
    b = np.asarray(other, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"'nll' and 'other' must be equal-length 1-d: {a.shape}, {b.shape}")
    if a.size != len(ids) - 1:
        raise ValueError(f"'ids' must hold len(nll) + 1 = {a.size + 1} tokens: {len(ids)}")
    return a, b


def _find(rows: Sequence[Mapping[str, Any]], want: Mapping[str, Any]) -> Mapping[str, Any]:
    """The first ``ppl`` row whose fields equal ``want``'s (``streams`` and ``signal``
    default as in ``_runs.row_key``; budgets compared to 6 places)."""
    from kvpolicy.evict.quality._runs import KEY_DEFAULTS

    for r in rows:
        if r.get("task") != "ppl":
            continue
        if all(
            round(r.get(k, 0.0), 6) == round(v, 6)
            if k == "budget"
            else r.get(k, KEY_DEFAULTS.get(k)) == v
            for k, v in want.items()
        ):
            return r
    raise ValueError(f"no ppl row with {dict(want)} in the results file")


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    import pathlib

    from kvpolicy.evict.quality._model import load_smollm2
    from kvpolicy.evict.quality._runs import read_rows
    from kvpolicy.evict.quality._texts import EVAL_TEXTS, eval_text

    parser = argparse.ArgumentParser(
        prog="python -m kvpolicy.evict.quality.losses", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rows", type=pathlib.Path, required=True, help="results file")
    parser.add_argument("--text", required=True, choices=sorted(EVAL_TEXTS))
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--budget", type=float, required=True)
    parser.add_argument("--policy", required=True, help="the policy whose losses to explain")
    parser.add_argument("--against", required=True, help="the policy to compare it with")
    parser.add_argument("--streams", default="layer", help="of --policy (layer, kv-head)")
    parser.add_argument("--signal", default="attention", help="of --policy")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument(
        "--attention",
        action="store_true",
        help="also run a full-cache pass and report how much attention each copied "
        "token's earlier occurrence received before the copy",
    )
    args = parser.parse_args(argv)
    rows = read_rows(args.rows)

    def want(policy: str, streams: str, signal: str) -> dict[str, Any]:
        full = policy == "full"
        return {
            "text": args.text,
            "tokens": args.tokens,
            "policy": policy,
            "budget": 1.0 if full else args.budget,
            "streams": "layer" if full else streams,
            "signal": "attention" if full else signal,
        }

    try:
        mine = _find(rows, want(args.policy, args.streams, args.signal))
        theirs = _find(rows, want(args.against, "layer", "attention"))
    except ValueError as exc:
        parser.error(str(exc))
    lm = load_smollm2()
    ids = lm.encode(eval_text(args.text)[0], args.tokens).tolist()
    a, b = np.array(mine["nll"]), np.array(theirs["nll"])
    print(f"{args.policy} against {args.against}, {args.text}, budget {args.budget:g}: "
          f"{a.sum() - b.sum():+.1f} nats over {a.size} positions")  # fmt: skip
    print("copy distance    positions   nats")
    for bucket, count, total in loss_by_distance(a, b, ids):
        print(f"{bucket:>15}  {count:>9}  {total:+7.1f}")
    mass = None
    if args.attention:
        from kvpolicy.evict.quality._record import mean_attention

        mass = mean_attention(lm, lm.encode(eval_text(args.text)[0], args.tokens))
    print("position  delta  distance  context -> target")
    for s in loss_sources(a, b, ids, args.top):
        ctx = lm.tokenizer.decode(ids[max(0, s.position - 12) : s.position + 1])
        tgt = lm.tokenizer.decode(ids[s.position + 1 : s.position + 2])
        dist = "never" if s.distance is None else str(s.distance)
        print(f"{s.position:>8}  {s.delta:+.2f}  {dist:>8}  {ctx[-40:]!r} -> {tgt!r}")
        got = None if mass is None else source_attention(mass, ids, s.position)
        if got is not None:
            print(
                f"{'':>8}  source {got.source}: received {got.mean:.2e} per query before the "
                f"copy (even spread {got.uniform:.2e}), {got.above:.0%} of keys above it; "
                f"{got.at_copy:.2e} at the copy"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
