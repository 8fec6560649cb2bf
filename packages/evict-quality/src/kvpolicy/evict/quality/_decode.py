"""Token-by-token decoding with the KV cache held to a budget by an eviction policy.

Two ways to split a layer's cache into streams (``streams``):

* ``"layer"`` (the default): one :class:`~kvpolicy.kvmodel.EvictionPolicy` instance and one
  stream (``"layer{i}"``) per decoder layer; each layer keeps at most ``budget_tokens``
  tokens, the setting of the issue's prototype ("128 tokens per layer"). The KV heads of a
  layer share one set of resident tokens, so the attention a token receives is averaged over
  all query heads.
* ``"kv-head"``: one instance and one stream (``"layer{i}.head{h}"``) per KV head of each
  layer, fed that head's attention (the mean over the query heads of its group); each KV
  head keeps its own ``budget_tokens`` tokens, so the memory is the same and the choice
  finer (kvpress's presses select this way). Head ``h`` attends only to its own resident
  keys: the cache holds a different set of positions in each head's slice.

Keys stay rotated at their true positions (RoPE is applied before caching) and each new query
gets its true position, so evicting a token never shifts the others.

One step for token ``t`` (all layers)::

    forward(ids[t], position t)  ->  logits (V,), attention per layer (H, resident + 1)
    NLL of ids[t + 1]
    insert(layer, [t], signals)   [tokens(layer, [t], ids[t])]
    observe(layer, resident, attention)   evict(budget)
    drop the evicted positions from that layer's keys and values
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

import numpy as np
from attrs import field, frozen
from attrs.validators import ge, instance_of
from numpy.typing import NDArray

from kvpolicy.evict import ContentAware, ReturnPredictor
from kvpolicy.evict.predictors import CompactReturnPredictor, compact_features
from kvpolicy.evict.quality._model import CausalLM
from kvpolicy.kvmodel import EvictionPolicy

__all__ = [
    "SIGNALS",
    "STREAMS",
    "DecodeResult",
    "FeatureKind",
    "decode_batch",
    "decode_perplexity",
    "feature_kind",
    "output_share",
]

FeatureKind = Literal["logits", "compact"]
"""What a return predictor reads: the raw (1, V) logits or the (1, 4) compact features."""

STREAMS = ("layer", "kv-head")
"""How a layer's cache is split into policy streams: one per layer, or one per KV head."""

SIGNALS = ("attention", "output")
"""What a policy observes of each resident token after a step: ``"attention"``, the
attention weight the query gives it (mean over the stream's query heads); ``"output"``, its
share of what dropping it would change in the attention output (:func:`output_share`)."""


_ATTENTION = "kvpolicy_ragged_eager"


def _ragged_eager(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float,
    dropout: float = 0.0,
    **_kwargs: Any,
) -> tuple[Any, Any]:
    """Eager attention over a layer's own resident keys.

    Policies may leave layers with different numbers of resident tokens (Token-PD's keep
    rule prices out a different count in each), while the model builds one mask for all
    layers, sized from the first. A single decode query (batch of one) may attend to every
    resident key, so the mask is not needed then; longer queries use it cut to this layer.

    Args:
        query: (1, heads, q, head_dim); key, value: (1, kv_heads, k, head_dim).

    Returns:
        ``(output (1, q, heads, head_dim), weights (1, heads, q, k))``.
    """
    import torch

    from kvpolicy.evict.hf import grouped_output, grouped_scores

    scores = grouped_scores(query, key) * scaling
    if attention_mask is not None and query.shape[2] > 1:
        scores = scores + attention_mask[..., : key.shape[-2]]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = grouped_output(weights, value).transpose(1, 2).contiguous()
    return out, weights


def _register_attention(name: str = _ATTENTION, function: Any = None) -> None:
    """Register ``function`` (:func:`_ragged_eager` when None) as transformers attention
    ``name``, with the eager mask."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(name, _ragged_eager if function is None else function)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, eager_mask)


def feature_kind(predictor: object) -> FeatureKind:
    """``"logits"`` for a predictor whose input is the logits (seed 000's MLP), else
    ``"compact"``."""
    vocab = getattr(predictor, "vocab_size", None)
    return (
        "logits"
        if isinstance(vocab, int) and not isinstance(predictor, CompactReturnPredictor)
        else "compact"
    )


@frozen
class DecodeResult:
    """Outcome of one decoding run."""

    perplexity: float = field(validator=instance_of(float))
    """exp of the mean next-token NLL over the predicted tokens."""
    tokens: int = field(validator=[instance_of(int), ge(2)])
    """Tokens fed (``tokens - 1`` predicted)."""
    max_resident: int = field(validator=[instance_of(int), ge(0)])
    """Largest resident count of any layer after any step's eviction."""
    mean_resident: float = field(validator=instance_of(float))
    """Mean over steps and layers of the resident count after eviction (a policy may keep
    fewer tokens than the budget: Token-PD's keep rule evicts every token priced out)."""
    nll: NDArray[np.float64] = field(factory=lambda: np.empty(0), eq=False)
    """(tokens - 1,) next-token negative log-likelihood at each predicted position (the
    bootstrap of :func:`bootstrap_ratio` resamples these)."""
    correct: NDArray[np.bool_] = field(factory=lambda: np.empty(0, dtype=bool), eq=False)
    """(tokens - 1,) whether the most likely next token (argmax of the logits) was the
    actual one, at each predicted position (the key-value lookup scores these)."""
    seconds: float = field(default=0.0, converter=float)
    """Wall-clock seconds of the decoding loop (model, predictor and policy)."""
    policy_seconds: float = field(default=0.0, converter=float)
    """Seconds of those spent outside the model's forward pass: reading attention, the
    predictor, the policy's insert/observe/evict and cutting the cache."""

    @property
    def ms_per_step(self) -> float:
        """Mean wall-clock milliseconds per decoded token."""
        return 1000.0 * self.seconds / max(self.tokens - 1, 1)

    @property
    def policy_ms_per_step(self) -> float:
        """Mean milliseconds per decoded token spent on eviction outside the model."""
        return 1000.0 * self.policy_seconds / max(self.tokens - 1, 1)


def decode_perplexity(
    lm: CausalLM,
    input_ids: Any,
    make_policy: Callable[[], EvictionPolicy] | None,
    budget_tokens: int,
    predictor: ReturnPredictor | None = None,
    progress: Callable[[int], None] | None = None,
    streams: str = "layer",
    pooled: bool = False,
    signal: str = "attention",
) -> DecodeResult:
    """Perplexity of ``input_ids`` decoded one token at a time under a KV budget.

    Args:
        lm: the model (eager attention).
        input_ids: (n,) int64 torch tensor of token ids, n >= 2.
        make_policy: builds one fresh policy per layer; None keeps the full cache.
        budget_tokens: tokens each layer may keep after a step (ignored for the full cache).
        predictor: ReturnPredictor whose ``(returns, risks)`` become the (1, 2) ``signals``
            of each inserted token (column 0 R̂, column 1 σ̂²); None passes no signals.
        progress: called with 1 after every step.
        streams: ``"layer"`` (one policy stream per layer) or ``"kv-head"`` (one per KV
            head of each layer, each keeping ``budget_tokens``); see the module docstring.
        pooled: one policy holds every stream and keeps ``budget_tokens`` times the number
            of streams across them (the batch-global eviction evict's policies are built
            for): the same memory, spread over the layers as the policy prices them.
        signal: what ``observe`` receives for each resident token, one of
            :data:`SIGNALS`: the attention weight (default) or :func:`output_share`.

    Returns:
        The perplexity and the largest resident count seen after eviction.

    Raises:
        ValueError: fewer than 2 tokens, a budget < 1 with a policy, or unknown ``streams``
            or ``signal``.
    """
    import torch

    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1)
    return decode_batch(
        lm, ids, make_policy, budget_tokens, predictor, progress, streams, pooled, signal
    )[0]


def decode_batch(
    lm: CausalLM,
    input_ids: Any,
    make_policy: Callable[[], EvictionPolicy] | Sequence[Callable[[], EvictionPolicy]] | None,
    budget_tokens: int,
    predictor: ReturnPredictor | None = None,
    progress: Callable[[int], None] | None = None,
    streams: str = "layer",
    pooled: bool = False,
    signal: str = "attention",
) -> list[DecodeResult]:
    """:func:`decode_perplexity` of several texts of one length at once, as one batch.

    Each text has its own policies (one per layer) and its own resident tokens; the batch
    only shares the model's forward pass, which on a CPU costs little more for a few rows
    than for one. The texts of a batch must keep the same number of tokens in each layer
    after every step, which holds for every policy that fills its budget (FIFO, LRU, H2O,
    sink+window, Token-PD with ``keep_rule=False``); Token-PD's keep rule may evict a
    different number per text, so decode those texts one at a time.

    Args:
        input_ids: (texts, n) int64 torch tensor (one text may repeat, to compare several
            policies on it in one pass).
        make_policy: one factory for every text, or one per text (row of ``input_ids``).
        streams: ``"layer"`` or ``"kv-head"``, as in :func:`decode_perplexity`; with
            ``"kv-head"`` the KV heads of a layer must also keep equal counts (one cache
            tensor holds them), which the same budget-filling policies do.
        pooled: as in :func:`decode_perplexity` (layers then hold different counts, so
            one text at a time, with ``streams="layer"``).
        signal: as in :func:`decode_perplexity`.

    Returns:
        One result per text; each is timed by the whole batch.

    Raises:
        ValueError: fewer than 2 tokens, a budget < 1 with a policy, unknown ``streams``,
            or policies that leave the texts of the batch (or the KV heads of a layer) with
            different resident counts.
    """
    import torch
    from transformers import DynamicCache

    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() != 2 or ids.shape[0] < 1:
        raise ValueError(f"'input_ids' must be (texts, n): shape {tuple(ids.shape)}")
    n = int(ids.shape[1])
    if n < 2:
        raise ValueError(f"'input_ids' must hold at least 2 tokens: {n}")
    if make_policy is not None and (not isinstance(budget_tokens, int) or budget_tokens < 1):
        raise ValueError(f"'budget_tokens' must be an int >= 1: {budget_tokens!r}")
    if streams not in STREAMS:
        raise ValueError(f"'streams' must be one of {', '.join(STREAMS)}: {streams!r}")
    if signal not in SIGNALS:
        raise ValueError(f"'signal' must be one of {', '.join(SIGNALS)}: {signal!r}")
    kind = feature_kind(predictor) if predictor is not None else "compact"
    layers = lm.num_layers
    per_layer = 1 if streams == "layer" else int(lm.model.config.num_key_value_heads)
    makers = [make_policy] * int(ids.shape[0]) if callable(make_policy) else make_policy
    if makers is not None and len(makers) != int(ids.shape[0]):
        raise ValueError(
            f"'make_policy' lists {len(makers)} factories for {int(ids.shape[0])} texts"
        )
    if pooled and (per_layer != 1 or int(ids.shape[0]) != 1):
        raise ValueError("'pooled' decodes one text with streams='layer'")
    if makers is None:
        policies = None
    elif pooled:  # one instance behind every stream
        policies = [[mp()] * layers for mp in makers]
    else:
        policies = [[mp() for _ in range(layers * per_layer)] for mp in makers]
    cache = DynamicCache(config=lm.model.config)
    _register_attention()
    previous = lm.model.config._attn_implementation
    lm.model.set_attn_implementation(_ATTENTION)
    try:
        return _decode(
            lm,
            ids,
            policies,
            per_layer,
            budget_tokens,
            predictor,
            kind,
            cache,
            progress,
            pooled,
            signal,
        )
    finally:
        lm.model.set_attn_implementation(previous)


def _signals(
    predictor: ReturnPredictor,
    kind: FeatureKind,
    logits: Any,
    t: int,
    arrival: NDArray[np.float64],
) -> NDArray[np.float64]:
    """(texts, 2) ``(R̂, σ̂²)`` of the token inserted at step ``t`` of each text."""
    z = logits.double().numpy()
    if kind == "logits":
        feats = z
    else:
        feats = compact_features(z, np.full(z.shape[0], t, dtype=np.int64), arrival)
    returns, risks = predictor.predict(feats)
    return np.column_stack([returns, risks]).astype(np.float64)


def _decode(
    lm: CausalLM,
    ids: Any,
    policies: list[list[EvictionPolicy]] | None,
    per_layer: int,
    budget_tokens: int,
    predictor: ReturnPredictor | None,
    kind: FeatureKind,
    cache: Any,
    progress: Callable[[int], None] | None,
    pooled: bool = False,
    signal: str = "attention",
) -> list[DecodeResult]:
    """The decoding loop; ``policies[r][layer * per_layer + s]`` owns stream ``s`` of
    ``layer`` in text ``r`` (``per_layer`` is 1 or the number of KV heads)."""
    import torch

    rows, n = int(ids.shape[0]), int(ids.shape[1])
    layers = lm.num_layers
    cache_arg = _cache_argument(lm.model)
    names = [
        [f"layer{i}"] if per_layer == 1 else [f"layer{i}.head{h}" for h in range(per_layer)]
        for i in range(layers)
    ]
    # resident[r][l][s] is the true position of each cached key of stream s of layer l in
    # text r (per KV head: that head's slice of the layer's keys).
    resident = [
        [[np.empty(0, dtype=np.int64) for _ in range(per_layer)] for _ in range(layers)]
        for _ in range(rows)
    ]
    nll = np.empty((rows, n - 1), dtype=np.float64)
    correct = np.zeros((rows, n - 1), dtype=bool)
    # A policy that wants token ids (ContentAware, Token-PD's copy_bonus) gets each
    # token's id right after its insert; rows of a batch may hold different policies.
    tagged = [isinstance(row[0], ContentAware) for row in policies] if policies else []
    id_rows = ids.numpy()
    max_resident = 0
    resident_sum = 0
    outside = 0.0
    start = time.perf_counter()
    with torch.no_grad():
        for t in range(n - 1):
            kv_len = max(len(r[0]) for r in resident[0])
            out, logits = forward_step(lm, ids, t, kv_len, {cache_arg: cache}, nll, correct)
            step_start = time.perf_counter()
            for per_text in resident:
                for per_head in per_text:
                    for s in range(per_layer):
                        per_head[s] = np.append(per_head[s], np.int64(t))
            if policies is None:
                max_resident = max(max_resident, len(resident[0][0][0]))
                resident_sum += len(resident[0][0][0]) * layers * rows
            else:
                att = [
                    _stream_attention(out.attentions[layer], per_layer) for layer in range(layers)
                ]
                # The predictor's arrival feature is always the attention weight.
                arrival_att = att
                if signal == "output":
                    att = [
                        output_share(
                            out.attentions[layer][:, :, 0, :],
                            cache.layers[layer].values,
                            per_layer,
                        )
                        for layer in range(layers)
                    ]
                signals = None
                if predictor is not None:
                    arrival = np.mean([a[:, :, -1].mean(axis=1) for a in arrival_att], axis=0)
                    signals = _signals(predictor, kind, logits, t, arrival)
                pos = np.array([t], dtype=np.int64)
                if pooled:
                    held_max = _pooled_step(
                        policies[0][0],
                        resident[0],
                        att,
                        signals,
                        pos,
                        names,
                        budget_tokens,
                        cache,
                        id_rows[0, t : t + 1] if tagged[0] else None,
                    )
                    max_resident = max(max_resident, held_max)
                    resident_sum += sum(len(r[0]) for r in resident[0])
                for layer in range(layers if not pooled else 0):
                    keep_rows = []
                    for r in range(rows):
                        keep_heads = []
                        for s in range(per_layer):
                            policy = policies[r][layer * per_layer + s]
                            stream = names[layer][s]
                            held_now = resident[r][layer][s]
                            policy.insert(
                                stream, pos, None if signals is None else signals[r : r + 1]
                            )
                            if tagged[r]:
                                tag = cast(ContentAware, policy)
                                tag.tokens(stream, pos, id_rows[r, t : t + 1])
                            policy.observe(stream, held_now, att[layer][r, s])
                            evicted = policy.evict(budget_tokens).get(stream)
                            keep = np.ones(len(held_now), dtype=bool)
                            if evicted is not None and len(evicted):
                                keep = ~np.isin(held_now, evicted)
                                resident[r][layer][s] = held_now[keep]
                            if policy.resident_tokens() != len(resident[r][layer][s]):
                                raise RuntimeError(
                                    f"policy reports {policy.resident_tokens()} resident "
                                    f"tokens in {stream}, the cache holds "
                                    f"{len(resident[r][layer][s])}"
                                )
                            keep_heads.append(np.flatnonzero(keep))
                        keep_rows.append(keep_heads)
                    _cut(cache.layers[layer], keep_rows, layer)
                    held = len(resident[0][layer][0])
                    max_resident = max(max_resident, held)
                    resident_sum += held * rows
            outside += time.perf_counter() - step_start
            if progress is not None:
                progress(1)
    seconds = time.perf_counter() - start
    return [
        DecodeResult(
            perplexity=math.exp(float(nll[r].mean())),
            tokens=n,
            max_resident=max_resident,
            mean_resident=resident_sum / ((n - 1) * layers * rows),
            nll=nll[r],
            correct=correct[r],
            seconds=seconds,
            policy_seconds=outside,
        )
        for r in range(rows)
    ]


def forward_step(
    lm: CausalLM,
    ids: Any,
    t: int,
    kv_len: int,
    cache: dict[str, Any],
    nll: NDArray[np.float64],
    correct: NDArray[np.bool_],
) -> tuple[Any, Any]:
    """One decoding step of every row: token ``t`` in at position ``t`` with attentions
    out, ``nll[:, t]`` and ``correct[:, t]`` filled for token ``t + 1``; the model's output
    and the step's logits (float).

    ``kv_len`` is the longest layer's cache length: the mask for one query allows every
    cached key and ``cache_position`` only sizes it, so that length serves every layer.
    ``cache`` is ``{argument name: cache}`` (see :func:`_cache_argument`).
    """
    import torch

    out = lm.model(
        input_ids=ids[:, t : t + 1],
        position_ids=torch.full((int(ids.shape[0]), 1), t),
        cache_position=torch.tensor([kv_len]),
        use_cache=True,
        output_attentions=True,
        **cache,
    )
    logits = out.logits[:, -1].float()
    nxt = ids[:, t + 1]
    nll[:, t] = -torch.log_softmax(logits, dim=-1).gather(1, nxt[:, None])[:, 0].numpy()
    correct[:, t] = (logits.argmax(dim=-1) == nxt).numpy()
    return out, logits


def _pooled_step(
    policy: EvictionPolicy,
    resident: list[list[NDArray[np.int64]]],
    att: list[NDArray[np.float64]],
    signals: NDArray[np.float64] | None,
    pos: NDArray[np.int64],
    names: list[list[str]],
    budget_tokens: int,
    cache: Any,
    token_ids: NDArray[np.int64] | None = None,
) -> int:
    """One step of one text under one policy for every layer (``pooled``): insert (and
    give the ``token_ids`` of a ContentAware policy) and observe each layer, evict once
    to ``budget_tokens`` per layer on average, cut each layer's cache; the largest
    layer's count."""
    layers = len(resident)
    for layer in range(layers):
        policy.insert(names[layer][0], pos, None if signals is None else signals[0:1])
        if token_ids is not None:
            cast(ContentAware, policy).tokens(names[layer][0], pos, token_ids)
        policy.observe(names[layer][0], resident[layer][0], att[layer][0, 0])
    evicted = policy.evict(budget_tokens * layers)
    for layer in range(layers):
        gone = evicted.get(names[layer][0])
        held_now = resident[layer][0]
        keep = np.ones(len(held_now), dtype=bool)
        if gone is not None and len(gone):
            keep = ~np.isin(held_now, gone)
            resident[layer][0] = held_now[keep]
        _cut(cache.layers[layer], [[np.flatnonzero(keep)]], layer)
    total = sum(len(r[0]) for r in resident)
    if policy.resident_tokens() != total:
        raise RuntimeError(
            f"policy reports {policy.resident_tokens()} resident tokens, the cache holds {total}"
        )
    return max(len(r[0]) for r in resident)


def _stream_attention(weights: Any, per_layer: int) -> NDArray[np.float64]:
    """(texts, per_layer, kv) attention of one decode query on each resident key, averaged
    over the query heads that read each stream: all of them for one stream per layer, the
    query heads of KV head ``s``'s group for stream ``s`` (query head ``q`` reads KV head
    ``q // group``, as in :func:`_ragged_eager`).

    Args:
        weights: (texts, heads, 1, kv) attention weights of one layer.
    """
    w = weights[:, :, 0, :]
    if per_layer == 1:
        return w.mean(dim=1, keepdim=True).double().numpy()  # type: ignore[no-any-return]
    texts, heads, kv = w.shape
    grouped = w.reshape(texts, per_layer, heads // per_layer, kv)
    return grouped.mean(dim=2).double().numpy()  # type: ignore[no-any-return]


def output_share(weights: Any, values: Any, per_layer: int) -> NDArray[np.float64]:
    """(texts, per_layer, kv) share of each resident token in what dropping it would change
    in one decode query's attention output.

    Dropping key ``i`` from a head whose weights are ``a`` and output ``o = sum_j a_j v_j``
    moves the output to ``(o - a_i v_i) / (1 - a_i)``, a change of norm
    ``a_i / (1 - a_i) * |v_i - o|``. The attention weight alone misses both factors: a
    token whose value is far from the output matters more than its weight says, and one
    near it (or an attention sink with a near-zero value but most of the weight) is
    weighed by what its removal redistributes. The changes are averaged over the query
    heads that read each stream (as :func:`_stream_attention`) and normalised to sum 1 per
    stream, so they stay on the scale of attention weights.

    Args:
        weights: (texts, heads, kv) attention weights of one layer's decode query.
        values: (texts, kv_heads, kv, head_dim) that layer's cached values (query head
            ``q`` reads KV head ``q // (heads // kv_heads)``).
        per_layer: 1 (one stream per layer) or ``kv_heads`` (one per KV head).
    """
    import torch

    texts, heads, kv = weights.shape
    kv_heads = int(values.shape[1])
    group = heads // kv_heads
    v = values.float()
    a = weights.float().reshape(texts, kv_heads, group, kv)
    o = torch.matmul(a, v)  # (texts, kv_heads, group, head_dim)
    dot = torch.matmul(v, o.transpose(2, 3))  # (texts, kv_heads, kv, group)
    dist2 = (v * v).sum(-1, keepdim=True) - 2.0 * dot + (o * o).sum(-1)[:, :, None, :]
    dist = dist2.clamp_min(0.0).sqrt()
    at = a.transpose(2, 3)  # (texts, kv_heads, kv, group)
    change = at / (1.0 - at).clamp_min(1e-6) * dist
    per_head = change.mean(dim=3)  # (texts, kv_heads, kv)
    share = per_head.mean(dim=1, keepdim=True) if per_layer == 1 else per_head
    share = share / share.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    return share.double().numpy()  # type: ignore[no-any-return]


def _cut(cached: Any, keep_rows: list[list[NDArray[np.int64]]], layer: int) -> None:
    """Keep entries ``keep_rows[r][s]`` of text ``r``'s keys and values in stream ``s`` of
    one layer: the whole layer when it has one stream, KV head ``s``'s slice otherwise."""
    import torch

    sizes = {len(k) for heads in keep_rows for k in heads}
    if len(sizes) != 1:
        raise ValueError(
            f"the texts of a batch or the KV heads of layer {layer} keep different numbers "
            f"of tokens ({sorted(sizes)}): decode them one at a time and per layer "
            "(Token-PD's keep rule does this)"
        )
    if len(keep_rows[0][0]) == cached.keys.shape[2]:
        return
    if len(keep_rows) == 1 and len(keep_rows[0]) == 1:
        index = torch.from_numpy(keep_rows[0][0])
        cached.keys = cached.keys[:, :, index]
        cached.values = cached.values[:, :, index]
        return
    # (texts, streams, kept, 1), broadcast over the KV heads when one stream spans them all.
    index = torch.from_numpy(np.stack([np.stack(heads) for heads in keep_rows]))[..., None]
    shape = (-1, cached.keys.shape[1], -1, cached.keys.shape[3])
    cached.keys = cached.keys.gather(2, index.expand(*shape))
    cached.values = cached.values.gather(2, index.expand(*shape))


def _cache_argument(model: Any) -> str:
    """The name under which ``model.forward`` takes the KV cache: ``cache`` from transformers
    5.24 on (``past_key_values`` is deprecated there), ``past_key_values`` before."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
