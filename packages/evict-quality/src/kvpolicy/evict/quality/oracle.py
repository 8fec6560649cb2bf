"""What eviction could reach at best on this model: policies that know the future.

Two oracles, both read from a full-cache pass over the same text (``mean_attention`` per
layer, the attention the 9 query heads give each key, averaged), both run through the
same decoding loop, budget and rows as ``kvpolicy evict eval``
(``python -m kvpolicy.evict.quality.oracle``):

- ``oracle:window=W``: after every step each layer keeps the ``B`` resident tokens that the
  next ``W`` queries attend to most in the full-cache pass (the rest are evicted). No
  causal policy knows this; it is a reference for how close to the full cache a per-layer
  selection of ``B`` tokens can get. It is not a strict bound: under eviction the later
  queries' attention differs from the full cache's, and keeping the best ``B`` now is
  greedy.
- ``pooled:<policy>`` (not an oracle): any kvpolicy policy, one instance for every layer
  of a text, keeping ``B`` times the layers in all (the batch-global eviction evict's
  policies are built for): the same memory, spread over the layers as the policy prices
  them. Token-PD gets the shipped compact predictor, as in ``kvpolicy evict eval``.
- ``token-pd:oracle-returns`` (with Token-PD's parameters): Token-PD whose return
  predictor is replaced by the realised returns of seed 000's definition (the mean
  attention the next ``horizon`` queries give a token, over layers and heads, as
  ``record_returns`` measures for training): a predictor with rank correlation 1. It
  tests the seed's claim that the predicted returns are what make Token-PD win.
- ``token-pd:...:copy-oracle=H`` (with Token-PD's parameters, ``copy_bonus`` its bonus,
  1 when unset): Token-PD whose copy bonus goes, knowing the text, to exactly the latest
  occurrences of the token ids that the text repeats within the next ``H`` tokens
  (:class:`CopySourceOracle`): every copy source to be used is kept as far as the bonus
  and the budget allow, and no other. It tests how much of what Token-PD loses to a
  window is the copied tokens themselves.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np
from numpy.typing import NDArray

from kvpolicy.evict import TokenPDConfig, TokenPDPolicy
from kvpolicy.evict.quality._decode import decode_batch
from kvpolicy.evict.quality._eval import budget_tokens, cli_texts_and_budgets, policy_factory
from kvpolicy.evict.quality._model import CausalLM, load_smollm2
from kvpolicy.evict.quality._record import mean_attention
from kvpolicy.evict.quality._runs import append_row, read_rows, result_row, row_key
from kvpolicy.evict.quality._texts import EVAL_TEXTS, eval_text
from kvpolicy.kvmodel import EvictionPolicy

__all__ = [
    "CopySourceOracle",
    "FutureAttentionOracle",
    "RealisedReturns",
    "future_attention",
    "main",
    "next_occurrence",
]


def future_attention(lm: CausalLM, input_ids: Any) -> NDArray[np.float32]:
    """Cumulative full-cache attention per layer: ``out[l, q + 1, k]`` is the attention
    queries ``0..q`` of layer ``l`` gave key ``k`` (head mean), ``out[l, 0] = 0``.

    Returns:
        (layers, n + 1, n) float32.
    """
    mass = mean_attention(lm, input_ids, per_layer=True)  # (layers, n, n) float64
    layers, n, _ = mass.shape
    out = np.zeros((layers, n + 1, n), dtype=np.float32)
    np.cumsum(mass, axis=1, out=out[:, 1:])
    return out


class FutureAttentionOracle:
    """Keeps, in each layer, the tokens the next ``window`` queries attend to most.

    One instance serves one stream (``"layer{i}"``, as the quality harness names them);
    ``cumulative`` is :func:`future_attention` of the text being decoded.

    Raises:
        ValueError: ``window`` < 1, or ``cumulative`` not (layers, n + 1, n).
    """

    def __init__(self, cumulative: NDArray[np.float32], window: int) -> None:
        """See the class docstring."""
        if cumulative.ndim != 3 or cumulative.shape[1] != cumulative.shape[2] + 1:
            raise ValueError(f"'cumulative' must be (layers, n + 1, n): shape {cumulative.shape}")
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"'window' must be an int >= 1: {window!r}")
        self._cum = cumulative
        self._window = window
        self._streams: dict[str, NDArray[np.int64]] = {}
        self._layer: dict[str, int] = {}

    def insert(
        self,
        stream: str,
        positions: NDArray[np.int64],
        signals: NDArray[np.float64] | None = None,
    ) -> None:
        """Add tokens at ``positions`` to ``stream``."""
        if stream not in self._streams:
            if not stream.startswith("layer") or not stream[5:].isdigit():
                raise ValueError(f"'stream' must be named 'layer<i>': {stream!r}")
            self._layer[stream] = int(stream[5:])
            self._streams[stream] = np.empty(0, dtype=np.int64)
        self._streams[stream] = np.append(self._streams[stream], positions)

    def observe(self, stream: str, positions: NDArray[np.int64], mass: Any) -> None:
        """Nothing to learn: the oracle knows the attention to come."""

    def evict(self, budget_tokens: int) -> Mapping[str, NDArray[np.int64]]:
        """Per stream, evict all but the ``budget_tokens`` with the most attention from the
        next ``window`` queries (ties keep the later token)."""
        out: dict[str, NDArray[np.int64]] = {}
        n = self._cum.shape[2]
        for stream, held in self._streams.items():
            if len(held) <= budget_tokens:
                continue
            t = int(held.max())
            end = min(t + self._window, n - 1)
            cum = self._cum[self._layer[stream]]
            score = cum[end + 1, held] - cum[t + 1, held] + held * 1e-12
            order = np.argsort(score, kind="stable")
            gone = np.sort(held[order[: len(held) - budget_tokens]])
            self._streams[stream] = held[np.isin(held, gone, invert=True)]
            out[stream] = gone
        return out

    def remove(self, stream: str) -> None:
        """Forget ``stream``."""
        self._streams.pop(stream, None)
        self._layer.pop(stream, None)

    def resident_tokens(self) -> int:
        """Tokens resident across the streams."""
        return sum(len(v) for v in self._streams.values())


def next_occurrence(token_ids: Any) -> NDArray[np.int64]:
    """(n,) int64 position of the next occurrence of each token's id after it (``n`` when
    none), for (n,) integer ``token_ids``."""
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    n = ids.size
    out = np.full(n, n, dtype=np.int64)
    seen: dict[int, int] = {}
    for p in range(n - 1, -1, -1):
        tok = int(ids[p])
        out[p] = seen.get(tok, n)
        seen[tok] = p
    return out


class CopySourceOracle(TokenPDPolicy):
    """Token-PD whose copy bonus knows which copies are coming.

    At each step the bonus (``bonus`` times the even share ``1/n`` of the stream's ``n``
    tokens, as ``TokenPDConfig.copy_bonus``) goes to the tokens that are the latest
    occurrence of their id so far *and* whose id the text repeats within the next
    ``horizon`` tokens: the sources of the copies to come, and nothing else. Every stream
    of one instance decodes the same text (the quality harness builds one per layer).

    Raises:
        ValueError: ``horizon`` < 1, or ``bonus`` not finite and > 0.
    """

    def __init__(
        self, config: TokenPDConfig, token_ids: Any, horizon: int, bonus: float = 1.0
    ) -> None:
        """See the class docstring; ``config``'s own ``copy_bonus`` is not used."""
        if not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"'horizon' must be an int >= 1: {horizon!r}")
        if not (math.isfinite(bonus) and bonus > 0):
            raise ValueError(f"'bonus' must be finite and > 0: {bonus!r}")
        super().__init__(attrs.evolve(config, copy_bonus=0.0))
        self._next = next_occurrence(token_ids)
        self._horizon = horizon
        self._bonus = float(bonus)
        self._now = -1

    def insert(
        self,
        stream: str,
        positions: NDArray[np.int64],
        signals: NDArray[np.float64] | None = None,
    ) -> None:
        """:meth:`TokenPDPolicy.insert`; the newest position is the present."""
        super().insert(stream, positions, signals)
        self._now = max(self._now, int(np.max(positions)))

    def _copy_bonus(self, slots: NDArray[np.int64], stream: str) -> NDArray[np.float64]:
        """The bonus on the latest occurrences whose id the text repeats within the
        horizon, in place of Token-PD's latest occurrences of every id."""
        nxt = self._next[self.table.positions_of(slots)]
        # next_occurrence says n for an id never repeated: no copy to come.
        soon = (nxt > self._now) & (nxt <= self._now + self._horizon) & (nxt < self._next.size)
        share = self._bonus / max(self.table.stream_tokens(stream), 1)
        return share * soon.astype(np.float64)


class RealisedReturns:
    """A return predictor that knows the answer: seed 000's realised return of each token
    (mean attention from the next ``horizon`` queries, over layers and heads, in the
    full-cache pass), looked up by the position in the compact features (column 2); row
    ``i`` of each call is text ``i`` of the batch. Risk 0."""

    def __init__(self, cumulative: list[NDArray[np.float32]], horizon: int = 128) -> None:
        """``cumulative``: :func:`future_attention` of each text of the batch."""
        if not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"'horizon' must be an int >= 1: {horizon!r}")
        self._returns = []
        for cum in cumulative:
            n = cum.shape[2]
            k = np.arange(n)
            end = np.minimum(k + horizon, n - 1)
            span = np.maximum(end - k, 1)
            per_layer = cum[:, end + 1, k] - cum[:, k + 1, k]  # (layers, n)
            self._returns.append(np.clip(per_layer.mean(axis=0) / span, 0.0, 1.0))

    def predict(
        self, features: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(returns, risks)`` of the tokens whose compact features are ``features``."""
        pos = features[:, 2].astype(np.int64)
        returns = np.array([self._returns[i][p] for i, p in enumerate(pos)], dtype=np.float64)
        return returns, np.zeros(len(pos))


def _oracle_factories(
    label: str,
    cums: list[NDArray[np.float32]],
    k: int,
    layers: int = 0,
    encoded: list[Any] | None = None,
) -> tuple[list[Callable[[], EvictionPolicy]], Any]:
    """Per-text policy factories and the predictor of an oracle ``label`` (``pooled:``
    labels need ``layers`` and no ``cums`` but one entry per text; ``copy-oracle`` labels
    need the ``encoded`` token ids of each text)."""
    if label.startswith("token-pd") and ":copy-oracle=" in label:
        base_label, _, raw = label.rpartition(":copy-oracle=")
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"'policy' copy-oracle=H needs an int H >= 1: {label!r}")
        if encoded is None:
            raise ValueError(f"'policy' {label!r} needs the texts' token ids")
        factory = policy_factory(base_label)
        assert factory is not None
        config: TokenPDConfig = factory(k).config  # type: ignore[attr-defined]
        bonus = config.copy_bonus or 1.0
        horizon = int(raw)
        from kvpolicy.evict.predictors import default_compact

        def copy_oracle(token_ids: Any) -> Callable[[], EvictionPolicy]:
            ids = np.asarray(token_ids)
            return lambda: CopySourceOracle(config, ids, horizon, bonus)

        return [copy_oracle(e) for e in encoded], default_compact()
    if label.startswith("oracle:window="):
        window = int(label.split("=", 1)[1])
        return [
            (lambda c=cum: FutureAttentionOracle(c, window))  # type: ignore[misc]
            for cum in cums
        ], None
    if label.startswith("pooled:"):
        base = policy_factory(label.removeprefix("pooled:"))
        if base is None:
            raise ValueError(f"'policy' pools a policy, not the full cache: {label!r}")
        from kvpolicy.evict.predictors import default_compact

        pool: Callable[[int], EvictionPolicy] = base
        makers: list[Callable[[], EvictionPolicy]] = [lambda: pool(k * layers) for _ in cums]
        return makers, default_compact() if "token-pd" in label else None
    if label.startswith("token-pd") and label.endswith(":oracle-returns"):
        factory = policy_factory(label.removesuffix(":oracle-returns"))
        assert factory is not None
        return [lambda: factory(k) for _ in cums], RealisedReturns(cums)
    raise ValueError(
        "'policy' must be 'oracle:window=W', 'pooled:<policy>', "
        "'token-pd[:param=value...]:oracle-returns' or 'token-pd[:param=value...]:copy-oracle=H': "
        f"{label!r}"
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--policy`` oracle labels, ``--budget`` fractions, ``--text`` names,
    ``--tokens``, ``--task`` (``ppl``, or ``lookup``: the key-value lookup prompts of
    ``kvpolicy evict eval --task lookup``, whose full-cache pass includes the questions),
    ``--out`` (JSON lines, appended; finished rows skipped)."""
    parser = argparse.ArgumentParser(prog="python -m kvpolicy.evict.quality.oracle")
    parser.add_argument(
        "--policy", default="oracle:window=64,token-pd:keep_rule=false:memory=32:oracle-returns"
    )
    parser.add_argument("--budget", default="0.125,0.25,0.5")
    parser.add_argument("--text", default=",".join(EVAL_TEXTS))
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--task", choices=("ppl", "lookup"), default="ppl")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args(argv)
    labels = [p.strip() for p in args.policy.split(",") if p.strip()]
    texts, budgets = cli_texts_and_budgets(parser, args.text, args.budget)
    import torch

    torch.set_num_threads(1)
    lm = load_smollm2()
    done = {row_key(r) for r in read_rows(args.out)}
    lookups: list[Any] = [None] * len(texts)
    if args.task == "lookup":
        from kvpolicy.evict.quality._lookup import build_lookup

        lookups = [build_lookup(lm.tokenizer, eval_text(t)[0], args.tokens) for t in texts]
        encoded = [task.input_ids for task in lookups]
    else:
        encoded = [lm.encode(eval_text(t)[0], args.tokens) for t in texts]
    cums: list[NDArray[np.float32]] | None = None
    for label in labels:
        for b in budgets:
            keys = [
                {
                    "task": args.task,
                    "text": t,
                    "tokens": args.tokens,
                    "policy": label,
                    "budget": b,
                    "predictor": "oracle",
                    "streams": "layer",
                }
                for t in texts
            ]
            if all(row_key(key) in done for key in keys):
                continue
            k = budget_tokens(b, args.tokens)
            if label.startswith("pooled:"):  # no oracle: the texts are placeholders
                placeholders: list[Any] = [None] * len(encoded)
                makers, predictor = _oracle_factories(label, placeholders, k, lm.num_layers)
            else:
                if cums is None and ":copy-oracle=" not in label:
                    # one full-cache pass per text, shared by every run
                    cums = [future_attention(lm, ids) for ids in encoded]
                makers, predictor = _oracle_factories(label, cums or [], k, encoded=encoded)
            if label.startswith("pooled:"):  # layers differ in count: one text at a time
                results = [
                    decode_batch(lm, ids[None], [make], k, predictor, pooled=True)[0]
                    for ids, make in zip(encoded, makers, strict=True)
                ]
            else:
                results = decode_batch(lm, torch.stack(encoded), makers, k, predictor)
            for text, lookup, r in zip(texts, lookups, results, strict=True):
                row = result_row(
                    task=args.task,
                    text=text,
                    tokens=args.tokens,
                    policy=label,
                    budget=b,
                    kept=k,
                    predictor="oracle",
                    result=r,
                    lookup=lookup,
                    extra={"batch": len(texts)},
                )
                append_row(args.out, row)
                print(
                    f"{text} {label} {b}: perplexity {r.perplexity:.3f}"
                    + (f" accuracy {row['accuracy']}" if lookup is not None else ""),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
