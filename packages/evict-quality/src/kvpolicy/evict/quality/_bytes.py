"""Token-by-token decoding under a budget in bytes, tokens held at several precisions.

The loop of :func:`~kvpolicy.evict.quality.decode_batch` with kvmodel's
``DemotingPolicy`` in place of ``EvictionPolicy``: one policy and one stream
(``"layer{i}"``) per decoder layer and text, each layer holding at most
``budget_bytes`` after every step. An eviction-only policy runs wrapped in
:class:`~kvpolicy.evict.UniformPrecision` at 16 bits (unchanged otherwise). The cache
really holds what the states say: when a policy demotes a token to ``b`` bits, the
token's keys and values in that layer are replaced by their quantized-then-dequantized
values (:func:`~kvpolicy.evict.fake_quantize`: groups of ``group_size`` channels per
token, fp16 scales and zero points, round-to-nearest), so every later query reads the
quantization error; a token demoted twice is re-quantized from what it held. Bytes are
counted from each token's state with kvmodel's cost model (:class:`PrecisionCosts`).

The texts of a batch may keep different numbers of tokens in a layer (their policies
demote and evict differently), so each layer's cache is padded to the longest text and
the padding is masked out of the attention::

    cache slot:  0   1   2   ...  m_r-1 | pad ... pad | new token t
    positions:  p0  p1  p2  ...         |  -1 ... -1  | t
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from kvpolicy.evict import (
    EVICTED,
    ContentAware,
    PrecisionCosts,
    ReturnPredictor,
    UniformPrecision,
    fake_quantize,
)
from kvpolicy.evict.quality._decode import (
    DecodeResult,
    _cache_argument,
    _register_attention,
    _signals,
    _stream_attention,
    feature_kind,
    forward_step,
)
from kvpolicy.evict.quality._model import CausalLM
from kvpolicy.kvmodel import DemotingPolicy, EvictionPolicy, ModelSpec

__all__ = ["BytesResult", "decode_bytes", "layer_spec"]

_ATTENTION = "kvpolicy_padded_eager"
# Valid-slot masks of the current step, by layer index: (texts, kv) bool.
_VALID: dict[int, Any] = {}


def _padded_eager(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float,
    dropout: float = 0.0,
    **_kwargs: Any,
) -> tuple[Any, Any]:
    """Eager attention of one decode query over a layer's padded cache.

    Args:
        query: (texts, heads, 1, head_dim); key, value: (texts, kv_heads, kv, head_dim).

    Returns:
        ``(output (texts, 1, heads, head_dim), weights (texts, heads, 1, kv))``; padded
        slots get weight 0.
    """
    import torch

    from kvpolicy.evict.hf import grouped_output, grouped_scores

    scores = grouped_scores(query, key) * scaling
    valid = _VALID.get(int(getattr(module, "layer_idx", -1)))
    if valid is not None:
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = grouped_output(weights, value).transpose(1, 2).contiguous()
    return out, weights


def layer_spec(lm: CausalLM) -> ModelSpec:
    """One decoder layer of ``lm`` as a kvmodel ``ModelSpec`` (what one stream holds)."""
    cfg = lm.model.config
    heads = int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return ModelSpec(
        name=f"{lm.name} (one layer)",
        num_layers=1,
        num_kv_heads=int(cfg.num_key_value_heads),
        head_dim=head_dim,
    )


class BytesResult:
    """A :class:`DecodeResult` with the bytes each text's cache held."""

    __slots__ = ("bytes_max", "bytes_mean", "result")

    def __init__(self, result: DecodeResult, bytes_mean: float, bytes_max: float) -> None:
        self.result = result
        self.bytes_mean = bytes_mean
        """Bytes held after each step's allocation, every layer, mean over steps."""
        self.bytes_max = bytes_max
        """The most bytes held after any step's allocation, every layer."""


def decode_bytes(
    lm: CausalLM,
    input_ids: Any,
    make_policy: Callable[[], EvictionPolicy]
    | Sequence[Callable[[], EvictionPolicy] | None]
    | None,
    budget_bytes: float | Sequence[float],
    costs: PrecisionCosts,
    predictor: ReturnPredictor | None = None,
    progress: Callable[[int], None] | None = None,
    group_size: int = 32,
) -> list[BytesResult]:
    """Perplexity of each text decoded under a per-layer budget in bytes.

    Args:
        lm: the model.
        input_ids: (texts, n) int64 torch tensor.
        make_policy: one factory for every text or one per text (row; a row may repeat
            a text to compare policies in one pass); each layer of each row gets a fresh
            policy. A policy that is not a ``DemotingPolicy`` is held at 16 bits
            (:class:`UniformPrecision`). None (for all rows or one): the full cache at
            16 bits.
        budget_bytes: bytes each layer may hold after a step, for every row or one per
            row (ignored for a full-cache row).
        costs: bytes of one token of one layer at every precision the policies use (16
            bits included): what the harness counts.
        predictor: as in :func:`~kvpolicy.evict.quality.decode_batch`.
        progress: called with 1 after every step.
        group_size: channels per quantization group (the ``costs`` must assume the same).

    Returns:
        One result per row: ``seconds`` timed by the whole batch, ``policy_seconds``
        by the row's own policy calls, state changes and checks (and its share of the
        step's quantization).

    Raises:
        ValueError: fewer than 2 tokens, a negative or non-finite budget, or costs
            without 16 bits.
        RuntimeError: a policy's bytes or tokens disagree with what the cache holds.
    """
    import torch
    from transformers import DynamicCache

    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() != 2 or ids.shape[0] < 1:
        raise ValueError(f"'input_ids' must be (texts, n): shape {tuple(ids.shape)}")
    if int(ids.shape[1]) < 2:
        raise ValueError(f"'input_ids' must hold at least 2 tokens: {int(ids.shape[1])}")
    rows = int(ids.shape[0])
    budgets = [budget_bytes] * rows if isinstance(budget_bytes, int | float) else list(budget_bytes)
    if len(budgets) != rows:
        raise ValueError(f"'budget_bytes' lists {len(budgets)} budgets for {rows} rows")
    for b in budgets:
        if not (math.isfinite(b) and b >= 0):
            raise ValueError(f"'budget_bytes' must be finite and >= 0: {b!r}")
    if 16 not in costs.token_bytes:
        raise ValueError(f"'costs' must price 16 bits: {dict(costs.token_bytes)}")
    makers = (
        [make_policy] * rows if make_policy is None or callable(make_policy) else list(make_policy)
    )
    if len(makers) != rows:
        raise ValueError(f"'make_policy' lists {len(makers)} factories for {rows} rows")
    policies = [
        None if mp is None else [_demoting(mp(), costs) for _ in range(lm.num_layers)]
        for mp in makers
    ]
    cache = DynamicCache(config=lm.model.config)
    _register_attention(_ATTENTION, _padded_eager)
    previous = lm.model.config._attn_implementation
    lm.model.set_attn_implementation(_ATTENTION)
    try:
        return _loop(lm, ids, policies, budgets, costs, predictor, cache, progress, group_size)
    finally:
        lm.model.set_attn_implementation(previous)
        _VALID.clear()


def _demoting(policy: EvictionPolicy, costs: PrecisionCosts) -> DemotingPolicy:
    if isinstance(policy, DemotingPolicy):
        return policy
    return UniformPrecision(policy, 16, costs)


def _loop(
    lm: CausalLM,
    ids: Any,
    policies: list[list[DemotingPolicy] | None],
    budgets: list[float],
    costs: PrecisionCosts,
    predictor: ReturnPredictor | None,
    cache: Any,
    progress: Callable[[int], None] | None,
    group_size: int,
) -> list[BytesResult]:
    import torch

    rows, n = int(ids.shape[0]), int(ids.shape[1])
    layers = lm.num_layers
    kind = feature_kind(predictor) if predictor is not None else "compact"
    cache_arg = _cache_argument(lm.model)
    # slots[l][r]: the position held in each cache slot of layer l for text r (-1: pad);
    # bits[l][r]: its precision. Every text of a layer has the same number of slots.
    slots = [[np.empty(0, dtype=np.int64) for _ in range(rows)] for _ in range(layers)]
    bits = [[np.empty(0, dtype=np.int64) for _ in range(rows)] for _ in range(layers)]
    tagged = [
        row is not None and isinstance(getattr(row[0], "base", row[0]), ContentAware)
        for row in policies
    ]
    id_rows = ids.numpy()
    c16 = costs.token_bytes[16]
    nll = np.empty((rows, n - 1))
    correct = np.zeros((rows, n - 1), dtype=bool)
    held_bytes = np.zeros((rows, n - 1))
    held_tokens = np.zeros(rows)
    max_tokens = np.zeros(rows, dtype=np.int64)
    own = np.zeros(rows)  # seconds of each row's own work outside the forward pass
    start = time.perf_counter()
    with torch.no_grad():
        for t in range(n - 1):
            for layer in range(layers):
                if slots[layer][0].size:
                    valid = np.stack([s >= 0 for s in slots[layer]])
                    valid = np.concatenate([valid, np.ones((rows, 1), dtype=bool)], axis=1)
                    _VALID[layer] = torch.from_numpy(valid)
                else:
                    _VALID.pop(layer, None)
            kv_len = max(len(slots[layer][0]) for layer in range(layers))
            out, logits = forward_step(lm, ids, t, kv_len, {cache_arg: cache}, nll, correct)
            step_start = time.perf_counter()
            for layer in range(layers):
                for r in range(rows):
                    slots[layer][r] = np.append(slots[layer][r], np.int64(t))
                    bits[layer][r] = np.append(bits[layer][r], np.int64(16))
            att = [_stream_attention(out.attentions[layer], 1) for layer in range(layers)]
            signals = None
            if predictor is not None:
                arrival = np.mean([a[:, :, -1].mean(axis=1) for a in att], axis=0)
                signals = _signals(predictor, kind, logits, t, arrival)
            pos = np.array([t], dtype=np.int64)
            shared = time.perf_counter() - step_start
            # Demotions of this step: (layer, row, cache slots, bits, key axis), applied
            # at once.
            demoted: list[tuple[int, int, NDArray[np.int64], int, str]] = []
            kept: list[list[NDArray[np.int64]]] = []
            for layer in range(layers):
                keep_rows = []
                for r in range(rows):
                    row_start = time.perf_counter()
                    s = slots[layer][r]
                    valid = s >= 0
                    row_policies = policies[r]
                    if row_policies is None:  # the full cache
                        keep_rows.append(np.flatnonzero(valid))
                        held = float(np.count_nonzero(valid)) * c16
                    else:
                        keep = _step(
                            row_policies[layer],
                            f"layer{layer}",
                            pos,
                            None if signals is None else signals[r : r + 1],
                            id_rows[r, t : t + 1] if tagged[r] else None,
                            s,
                            valid,
                            att[layer][r, 0],
                            budgets[r],
                            (layer, r, bits[layer][r], demoted),
                            costs,
                        )
                        keep_rows.append(np.flatnonzero(keep))
                        held = float(costs.cost(bits[layer][r][keep]).sum())
                    held_bytes[r, t] += held
                    held_tokens[r] += len(keep_rows[-1])
                    max_tokens[r] = max(max_tokens[r], len(keep_rows[-1]))
                    own[r] += time.perf_counter() - row_start
                kept.append(keep_rows)
            q_start = time.perf_counter()
            _quantize_demoted(cache, demoted, group_size)
            for layer in range(layers):
                _repack(cache.layers[layer], kept[layer], slots[layer], bits[layer])
            q_time = time.perf_counter() - q_start
            # The shared work (attention, predictor, quantization, repacking) is split
            # evenly over the rows that have policies.
            with_policy = [r for r in range(rows) if policies[r] is not None]
            for r in with_policy:
                own[r] += (shared + q_time) / len(with_policy)
            if progress is not None:
                progress(1)
    seconds = time.perf_counter() - start
    return [
        BytesResult(
            DecodeResult(
                perplexity=math.exp(float(nll[r].mean())),
                tokens=n,
                max_resident=int(max_tokens[r]),
                mean_resident=float(held_tokens[r]) / ((n - 1) * layers),
                nll=nll[r],
                correct=correct[r],
                seconds=seconds,
                policy_seconds=float(own[r]),
            ),
            bytes_mean=float(held_bytes[r].mean()),
            bytes_max=float(held_bytes[r].max()),
        )
        for r in range(rows)
    ]


def _step(
    policy: DemotingPolicy,
    stream: str,
    pos: NDArray[np.int64],
    signals: NDArray[np.float64] | None,
    token_ids: NDArray[np.int64] | None,
    slots: NDArray[np.int64],
    valid: NDArray[np.bool_],
    attention: NDArray[np.float64],
    budget: float,
    where: tuple[int, int, NDArray[np.int64], list[tuple[int, int, NDArray[np.int64], int, str]]],
    costs: PrecisionCosts,
) -> NDArray[np.bool_]:
    """One row's policy step in one layer: insert, token ids, observe, allocate, apply the
    state changes (:func:`_apply`), and check the policy's counts against the cache's.

    Returns:
        Which slots stay.
    """
    layer, row, bits, demoted = where
    axis = str(getattr(policy, "key_axis", "token"))
    policy.insert(stream, pos, signals)
    if token_ids is not None:
        cast(ContentAware, getattr(policy, "base", policy)).tokens(stream, pos, token_ids)
    policy.observe(stream, slots[valid], attention[valid])
    changes = policy.allocate(budget).get(stream)
    keep = valid
    if changes is not None:
        keep = _apply(layer, row, slots, bits, valid, changes, demoted, axis)
    held = float(costs.cost(bits[keep]).sum())
    if abs(held - policy.resident_bytes()) > 1e-6 * (1.0 + held):
        raise RuntimeError(
            f"policy reports {policy.resident_bytes()} bytes in {stream}, the cache holds {held}"
        )
    kept = int(np.count_nonzero(keep))
    if policy.resident_tokens() != kept:
        raise RuntimeError(
            f"policy reports {policy.resident_tokens()} resident tokens in {stream}, "
            f"the cache holds {kept}"
        )
    return keep


def _apply(
    layer: int,
    row: int,
    slots: NDArray[np.int64],
    bits: NDArray[np.int64],
    valid: NDArray[np.bool_],
    changes: tuple[NDArray[np.int64], NDArray[np.int64]],
    demoted: list[tuple[int, int, NDArray[np.int64], int, str]],
    axis: str = "token",
) -> NDArray[np.bool_]:
    """One text's state changes in one layer: the slots to keep (evicted ones leave),
    ``bits`` lowered for demoted slots, and those slots listed in ``demoted`` (with the
    policy's key axis) for :func:`_quantize_demoted`."""
    positions, new_bits = changes
    order = np.argsort(slots, kind="stable")
    found = np.minimum(np.searchsorted(slots[order], positions), slots.size - 1)
    where = order[found]
    if not np.array_equal(slots[where], positions):
        raise RuntimeError(f"a policy changed positions the cache does not hold: {positions[:5]}")
    keep = valid.copy()
    gone = new_bits == EVICTED
    keep[where[gone]] = False
    for b in np.unique(new_bits[~gone]).tolist():
        hit = where[new_bits == b]
        bits[hit] = b
        demoted.append((layer, row, hit, int(b), axis))
    return keep


def _quantize_demoted(
    cache: Any, demoted: list[tuple[int, int, NDArray[np.int64], int, str]], group_size: int
) -> None:
    """Replace the keys and values of every demoted slot by their fake-quantized values,
    one :func:`fake_quantize` call per precision for what is grouped per token (values,
    and keys of a ``"token"`` key axis: quantizing the tokens of every layer and text
    together gives each the same result as alone), and one call per demotion for keys of
    a ``"channel"`` key axis (KIVI's layout: the demoted slots, whole groups of
    ``group_size`` tokens in position order, quantized per KV head and channel).

    Raises:
        RuntimeError: a ``"channel"`` demotion that is not whole groups of tokens.
    """
    import torch

    for layer, row, idx, b, axis in demoted:
        if axis != "channel":
            continue
        if idx.size % group_size:
            raise RuntimeError(
                f"keys quantized per channel need whole groups of {group_size} tokens: "
                f"{idx.size} demoted in layer {layer}"
            )
        held = cache.layers[layer].keys[row]  # (kv_heads, kv, head_dim)
        at = torch.from_numpy(idx)
        held[:, at] = fake_quantize(held[:, at], b, group_size, "channel")
    for b in sorted({d[3] for d in demoted}):
        mine = [d for d in demoted if d[3] == b]
        for name in ("keys", "values"):
            group = [d for d in mine if name == "values" or d[4] != "channel"]
            if not group:
                continue
            parts = []
            for layer, row, idx, _, _ in group:
                held = getattr(cache.layers[layer], name)[row]  # (kv_heads, kv, head_dim)
                parts.append(held[:, torch.from_numpy(idx)])
            flat = torch.cat([p.reshape(-1, p.shape[-1]) for p in parts])
            quant = fake_quantize(flat, b, group_size, "token")
            start = 0
            for (layer, row, idx, _, _), p in zip(group, parts, strict=True):
                size = p.numel() // p.shape[-1]
                held = getattr(cache.layers[layer], name)[row]
                held[:, torch.from_numpy(idx)] = quant[start : start + size].reshape(p.shape)
                start += size


def _repack(
    cached: Any,
    keep_rows: list[NDArray[np.int64]],
    slots: list[NDArray[np.int64]],
    bits: list[NDArray[np.int64]],
) -> None:
    """Keep slots ``keep_rows[r]`` of each text, left-aligned, padded to the longest text."""
    import torch

    width = max(len(k) for k in keep_rows)
    total = len(slots[0])
    if all(len(k) == total for k in keep_rows):
        return
    index = np.zeros((len(keep_rows), width), dtype=np.int64)
    for r, k in enumerate(keep_rows):
        index[r, : len(k)] = k
        pad = width - len(k)
        slots[r] = np.concatenate([slots[r][k], np.full(pad, -1, dtype=np.int64)])
        bits[r] = np.concatenate([bits[r][k], np.zeros(pad, dtype=np.int64)])
    idx = torch.from_numpy(index)[:, None, :, None]
    shape = (-1, cached.keys.shape[1], -1, cached.keys.shape[3])
    cached.keys = cached.keys.gather(2, idx.expand(*shape))
    cached.values = cached.values.gather(2, idx.expand(*shape))
