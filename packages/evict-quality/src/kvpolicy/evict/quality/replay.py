"""Replay a recorded full-cache attention through eviction policies, without the model.

``python -m kvpolicy.evict.quality.replay --text code --budget 0.25,0.5`` runs one
full-cache forward pass over a text (``mean_attention`` per layer: the head mean of each
layer), then drives each policy through the steps of :func:`replay` and reports the share
of each query's attention that falls on tokens the policy has evicted (``lost``), averaged
over the layers and queries. A 2,048-token text takes seconds per policy, against minutes
for a decode; but ``lost`` is an attention figure, not a perplexity, and RESULTS.md shows
the two disagree (a window loses five to ten times the attention of Token-PD and matches
it in perplexity at 50%): use it to see what a score can know, not to rank policies.

Each step ``t`` and layer ``l`` (stream ``"layer{l}"``): ``insert`` token ``t``, count the
full-cache attention ``A[l, t, k]`` of the tokens ``k <= t`` no longer resident, ``observe``
the resident tokens with ``A[l, t]`` renormalised over them (what a query attends to once
the rest is gone), ``evict(B)``. The attention a policy observes is the full cache's, not
the one its own evictions would produce; no return predictor is passed (``signals`` None).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Callable, Sequence

import attrs
import numpy as np
from numpy.typing import NDArray

from kvpolicy.evict.quality._eval import budget_tokens, cli_texts_and_budgets, policy_factory
from kvpolicy.kvmodel import EvictionPolicy

__all__ = ["ReplayResult", "main", "replay"]


@attrs.frozen
class ReplayResult:
    """What one policy lost on one recorded attention.

    Attributes:
        lost: mean over layers and queries of the attention share on evicted tokens.
        lost_by_layer: (layers,) the same per layer.
        max_resident: the most tokens one layer held after an ``evict``.
    """

    lost: float
    lost_by_layer: NDArray[np.float64]
    max_resident: int


def replay(
    attention: NDArray[np.floating], make_policy: Callable[[], EvictionPolicy], budget: int
) -> ReplayResult:
    """Drive one policy per layer (``make_policy()``, as the decoding harness does) through a
    recorded attention ``(layers, n, n)`` at ``budget`` tokens per layer (see the module
    docstring).

    Raises:
        ValueError: ``attention`` not (layers, n, n) with n >= 1, a row that does not sum
            to 1 over keys ``<= q`` (tolerance 1e-3), or ``budget`` < 1.
        RuntimeError: the policy evicts a token that is not resident or reports a resident
            count that differs from what it was given minus what it evicted.
    """
    att = np.asarray(attention)
    if att.ndim != 3 or att.shape[1] != att.shape[2] or att.shape[1] < 1:
        raise ValueError(f"'attention' must be (layers, n, n) with n >= 1: shape {att.shape}")
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"'budget' must be an int >= 1: {budget!r}")
    layers, n, _ = att.shape
    sums = att.sum(axis=2)
    bad = np.argwhere(np.abs(sums - 1.0) > 1e-3)
    if len(bad):
        layer, q = (int(v) for v in bad[0])
        raise ValueError(
            f"'attention' row [{layer}, {q}] must sum to 1, sums to {sums[layer, q]:.6f}"
        )
    streams = [f"layer{layer}" for layer in range(layers)]
    policies = [make_policy() for _ in range(layers)]
    resident = [np.empty(0, dtype=np.int64) for _ in range(layers)]
    lost = np.zeros(layers)
    max_resident = 0
    for t in range(n):
        pos = np.array([t], dtype=np.int64)
        for layer in range(layers):
            held = np.append(resident[layer], pos)
            row = np.asarray(att[layer, t], dtype=np.float64)
            kept = row[held].sum()
            lost[layer] += 1.0 - kept
            policy = policies[layer]
            policy.insert(streams[layer], pos, None)
            policy.observe(streams[layer], held, row[held] / kept if kept > 0 else row[held])
            gone = policy.evict(budget).get(streams[layer])
            if gone is not None and len(gone):
                if not np.isin(gone, held).all():
                    raise RuntimeError(f"policy evicted tokens not resident in {streams[layer]}")
                held = held[~np.isin(held, gone)]
            resident[layer] = held
            max_resident = max(max_resident, len(held))
            if policy.resident_tokens() != len(held):
                raise RuntimeError(
                    f"policy reports {policy.resident_tokens()} resident tokens in "
                    f"{streams[layer]} at step {t}, replay holds {len(held)}"
                )
    by_layer = lost / n
    return ReplayResult(float(by_layer.mean()), by_layer, max_resident)


def _factory(label: str, cumulative: NDArray[np.float32] | None) -> Callable[[int], EvictionPolicy]:
    """A policy factory for a kvpolicy label or ``oracle:window=W`` (needs ``cumulative``)."""
    if label.startswith("oracle:window="):
        from kvpolicy.evict.quality.oracle import FutureAttentionOracle

        window = int(label.split("=", 1)[1])
        assert cumulative is not None
        return lambda _budget: FutureAttentionOracle(cumulative, window)
    factory = policy_factory(label)
    if factory is None:
        raise ValueError(f"'policy' must evict; 'full' loses nothing: {label!r}")
    return factory


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--text``, ``--budget``, ``--policy`` (kvpolicy labels and
    ``oracle:window=W``), ``--tokens``; prints one line per (text, budget, policy) and
    appends JSON rows to ``--out`` if given."""
    parser = argparse.ArgumentParser(
        prog="python -m kvpolicy.evict.quality.replay", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--text", default="license,code,docs")
    parser.add_argument("--budget", default="0.25,0.5")
    parser.add_argument(
        "--policy",
        default="sink-window,h2o,token-pd:keep_rule=false:memory=32,oracle:window=64,"
        "oracle:window=256,oracle:window=1024",
    )
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    texts, budgets = cli_texts_and_budgets(parser, args.text, args.budget)
    labels = [p.strip() for p in args.policy.split(",") if p.strip()]
    if args.tokens < 2:
        parser.error(f"--tokens must be >= 2: {args.tokens}")
    for label in labels:
        try:
            _factory(label, np.zeros((1, 2, 1), dtype=np.float32))(1)
        except (ValueError, KeyError) as exc:
            parser.error(f"--policy {label!r}: {exc}")

    from kvpolicy.evict.quality._model import load_smollm2
    from kvpolicy.evict.quality._record import mean_attention
    from kvpolicy.evict.quality._texts import eval_text

    lm = load_smollm2()
    for name in texts:
        text, source = eval_text(name)
        ids = lm.encode(text, args.tokens)
        att = mean_attention(lm, ids, per_layer=True).astype(np.float32)
        att /= att.sum(axis=2, keepdims=True)
        cum = None
        if any(lb.startswith("oracle:") for lb in labels):
            cum = np.zeros((att.shape[0], att.shape[1] + 1, att.shape[2]), dtype=np.float32)
            np.cumsum(att, axis=1, out=cum[:, 1:])  # as oracle.future_attention
        for b in budgets:
            k = budget_tokens(b, int(att.shape[1]))
            for label in labels:
                factory = _factory(label, cum)
                result = replay(att, lambda f=factory, k=k: f(k), k)  # type: ignore[misc]
                print(f"{name} {b} {label}: lost {result.lost:.4f}", flush=True)
                if args.out is not None:
                    row = {
                        "task": "replay",
                        "text": name,
                        "source": source,
                        "tokens": int(att.shape[1]),
                        "budget": b,
                        "budget_tokens": k,
                        "policy": label,
                        "lost": result.lost,
                        "lost_by_layer": [round(float(v), 6) for v in result.lost_by_layer],
                    }
                    with args.out.open("a") as fh:
                        fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
