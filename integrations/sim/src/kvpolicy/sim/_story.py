"""Words for the figures: what each stack is, what happened in a run, and what to fix.

Everything here is computed from a :class:`SimResult` (and the :class:`StackConfig` it ran,
where a hint needs it): nothing is remembered from an earlier run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kvpolicy.kvmodel import (
    GPU_PRESETS,
    MODEL_PRESETS,
    ModelSpec,
    UnknownPresetError,
    get_gpu,
    get_model,
)
from kvpolicy.sim._config import StackConfig
from kvpolicy.sim._metrics import Summary
from kvpolicy.sim._simulate import SimResult

__all__ = ["WARN_SHARE", "describe_stack", "run_warnings", "what_happened"]

WARN_SHARE = 0.01
"""Share of arrived requests rejected, given up or unfinished above which a run warns."""

_GIB = 2**30


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _params(params: Mapping[str, Any], limit: int = 110) -> str:
    """``k=v`` for scalars, ``k=a, b, c`` (the keys) for mappings, ``k=[n items]`` for
    lists; cut at ``limit`` characters."""
    parts = []
    for k, v in params.items():
        if isinstance(v, Mapping):
            parts.append(f"{k}={', '.join(str(x) for x in v)}")
        elif isinstance(v, list | tuple):
            parts.append(f"{k}=[{len(v)} items]")
        else:
            parts.append(f"{k}={_scalar(v)}")
    text = "; ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _named(name: str, params: Mapping[str, Any]) -> str:
    return f"{name} ({_params(params)})" if params else name


def describe_stack(config: StackConfig) -> tuple[tuple[str, str], ...]:
    """One line per part of ``config``: ``(part, what it does)``, in the order a request
    meets them (gateway, admission, eviction, preemption, tiers, engine, SLO)."""
    c = config
    gw = c.gateway
    gateway = (
        "none: every request enters"
        if gw.name == "none"
        else f"{_named(gw.name, gw.params)}: admits each request or answers 429 with a "
        f"Retry-After; a denied client retries and gives up after {gw.max_retries + 1} 429s"
    )
    ad = c.admission
    admission = (
        "none: waiting requests join while KV blocks last"
        if ad.name == "none"
        else f"{_named(ad.name, ad.params)}: decides how many waiting requests join each iteration"
    )
    ev = c.eviction
    eviction = (
        "none: every token is kept"
        if ev.name == "none"
        else f"{_named(ev.name, ev.params)}: drops tokens of running requests to hold "
        f"resident KV to {ev.budget_fraction:.0%} of the pool"
    )
    pre = c.preemption
    preemption = (
        f"none: the last admitted first, by {pre.mode} (vLLM)"
        if pre.name == "none"
        else f"{_named(pre.name, pre.params)}: picks whom to preempt when blocks run out, "
        f"by {pre.mode}"
    )
    tiers = (
        "none: prefix blocks the GPU drops are lost (HBM prefix cache only)"
        if c.tiers.name == "none"
        else f"{_named(c.tiers.name, c.tiers.params)}: keeps the prefix blocks HBM drops "
        "below it (DRAM, disk) and loads them back on reuse"
    )
    en = c.engine
    pool = (
        f"a {en.kv_capacity_tokens:,}-token KV pool"
        if en.kv_capacity_tokens is not None
        else f"{en.gpu_memory_utilization:.0%} of HBM"
    )
    engine = (
        f"{en.block_size}-token blocks, prefix caching {'on' if en.prefix_caching else 'off'}, "
        f"at most {en.max_batch} running, {en.token_budget:,} tokens per iteration, {pool}"
    )
    slo = f"TTFT <= {c.slo.ttft_s:g} s and TPOT <= {c.slo.tpot_s * 1000:g} ms"
    return (
        ("gateway", gateway),
        ("admission", admission),
        ("eviction", eviction),
        ("preemption", preemption),
        ("tiers", tiers),
        ("engine", engine),
        ("SLO", slo),
    )


def _of(count: int, total: int) -> str:
    return f"{count:,} of {total:,} requests ({count / total:.1%})"


def _names(names: Sequence[str], conj: str = "or") -> str:
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + f" {conj} " + names[-1]


def _model(name: str) -> ModelSpec | None:
    """The model preset ``name``, or None for a model of one's own."""
    try:
        return get_model(name)
    except UnknownPresetError:
        return None


def _context_hint(result: SimResult, too_long: np.ndarray[Any, Any]) -> str:
    lengths = [r.total_len for r, t in zip(result.record.requests, too_long, strict=True) if t]
    longest = max(lengths)
    model = _model(result.model)
    if model is None:
        return f"the longest needs {longest:,} tokens: use a model with a longer context"
    context = model.max_context
    bigger = sorted({m.max_context for m in MODEL_PRESETS.values() if m.max_context > context})
    if not bigger:
        return f"the longest needs {longest:,} tokens and no model preset has more context"
    best = next((c for c in bigger if c >= longest), bigger[-1])
    names = [n for n, m in MODEL_PRESETS.items() if m.max_context == best]
    held = sum(n <= best for n in lengths)
    return (
        f"the longest needs {longest:,} tokens: use a longer-context model "
        f"(--model {_names(names)}, {best:,} tokens, holds {held:,} of them)"
    )


def _memory_hint(
    result: SimResult, too_big: np.ndarray[Any, Any], config: StackConfig | None
) -> str:
    longest = max(r.total_len for r, t in zip(result.record.requests, too_big, strict=True) if t)
    s = result.summary
    pool_gib = s.capacity_tokens * result.record.bytes_per_token / _GIB
    hint = (
        f"the longest needs {longest:,} tokens of KV, the pool holds {s.capacity_tokens:,} "
        f"({pool_gib:.1f} GiB): "
    )
    if config is not None and config.engine.kv_capacity_tokens is not None:
        return hint + "raise engine.kv_capacity_tokens or leave it unset to plan the pool"
    try:
        hbm = get_gpu(result.gpu).hbm_bytes
    except UnknownPresetError:
        return hint + "use a GPU with more memory or a smaller model"
    more = [n for n, g in GPU_PRESETS.items() if g.hbm_bytes > hbm]
    gpu = f"a GPU with more memory (--gpu {_names(more)})" if more else "a smaller model"
    return hint + f"use {gpu}, or raise engine.gpu_memory_utilization"


def _tenant_counts(s: Summary, key: str, of: bool = True, most: int = 5) -> str:
    """``tenant count[ of arrived]`` for the ``most`` tenants with the largest non-zero
    ``key``, and how many more there are."""
    rows = sorted(
        (t for t in s.tenants if getattr(t, key)), key=lambda t: (-getattr(t, key), t.tenant)
    )
    text = ", ".join(
        f"{t.tenant} {getattr(t, key):,}" + (f" of {t.requests:,}" if of else "")
        for t in rows[:most]
    )
    if len(rows) > most:
        text += f" and {len(rows) - most:,} more tenants"
    return text


def _rejected(s: Summary) -> str:
    reasons = [
        f"{count:,} {why}"
        for count, why in (
            (s.rejected_context, "longer than the context"),
            (s.rejected_memory, "larger than the KV pool"),
        )
        if count
    ]
    return f"{s.rejected:,} were rejected ({', '.join(reasons)})"


def run_warnings(result: SimResult, config: StackConfig | None = None) -> list[str]:
    """What went wrong in ``result`` for more than 1% of the arrived requests, each with its
    reason and a hint: rejections (too long for the model's context, or for the KV pool),
    clients that gave up after 429s, requests left unfinished.

    Args:
        result: the run.
        config: the stack it ran, for hints that name its settings (optional).
    """
    s, rec = result.summary, result.record
    n = s.requests
    out: list[str] = []
    if not n:
        return out
    limit = WARN_SHARE * n
    too_long = (
        rec.rejected & rec.rejected_context
        if rec.rejected_context is not None
        else np.zeros(n, dtype=np.bool_)
    )
    if s.rejected_context > limit:
        model = _model(result.model)
        context = f" {model.max_context:,}-token" if model is not None else ""
        out.append(
            f"{_of(s.rejected_context, n)} exceed {result.model}'s{context} context and "
            f"were rejected; {_context_hint(result, too_long)}"
        )
    if s.rejected_memory > limit:
        out.append(
            f"{_of(s.rejected_memory, n)} need more KV than the pool holds and were "
            f"rejected; {_memory_hint(result, rec.rejected & ~too_long, config)}"
        )
    if s.gave_up > limit:
        after = "repeated 429s"
        knobs = "gateway.max_retries"
        if config is not None and config.gateway.name != "none":
            after = f"{config.gateway.max_retries + 1} 429s from the {config.gateway.name} gateway"
            knobs = f"gateway.max_retries (now {config.gateway.max_retries})"
        out.append(
            f"{_of(s.gave_up, n)} gave up after {after} ({_tenant_counts(s, 'gave_up')}): "
            "the gateway's entitlements admit less than these tenants offer; raise their "
            f"share in gateway.params, or let clients retry longer with {knobs}"
        )
    if s.unfinished > limit:
        out.append(
            f"{_of(s.unfinished, n)} had not finished when the run stopped; their latency "
            "is not in the percentiles"
        )
    return out


def _gib(tokens: float, result: SimResult) -> float:
    return tokens * result.record.bytes_per_token / _GIB


def _reasons(r: SimResult) -> str:
    """``; by check: priority 500, tokens 56`` when the run recorded why."""
    reasons = r.record.denial_reasons
    if not reasons:
        return ""
    parts = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    return "; by check: " + ", ".join(f"{k} {v:,}" for k, v in parts)


def _door(r: SimResult) -> str:
    s = r.summary
    if not s.gate_denials:
        door = f"{r.stack} answered no 429s"
    else:
        door = (
            f"{r.stack}'s gateway answered {s.gate_denials:,} 429s "
            f"({_tenant_counts(s, 'denials', of=False)}{_reasons(r)})"
        )
        if s.gave_up:
            door += f" and {s.gave_up:,} requests gave up ({_tenant_counts(s, 'gave_up')})"
        else:
            door += ", and every denied request got in on a retry"
    if s.rejected:
        door += f"; {_rejected(s)}"
    if s.unfinished:
        door += f"; {s.unfinished:,} were unfinished when the run stopped"
    refreshes = r.record.gateway_refreshes
    if refreshes:
        door += (
            f"; from the service observed, its gateway's throughput estimate changed "
            f"{len(refreshes)} times, ending at {refreshes[-1][1]:,.0f} tokens/s"
        )
    return door + "."


def _memory(r: SimResult) -> str:
    s = r.summary
    cap = _gib(s.capacity_tokens, r)
    text = (
        f"{r.stack}'s KV peaked at {_gib(s.peak_kv_tokens, r):.1f} of {cap:.1f} GiB "
        f"({s.peak_kv_tokens / max(s.capacity_tokens, 1):.0%}; mean "
        f"{_gib(s.mean_kv_tokens, r):.1f} GiB)"
    )
    if s.preemptions:
        text += f", with {s.preemptions:,} preemptions ({s.recomputed_tokens:,} tokens recomputed"
        text += f", {s.swapped_tokens:,} swapped)" if s.swapped_tokens else ")"
    else:
        text += ", with no preemption"
    if s.evicted_tokens:
        text += (
            f"; eviction dropped {s.evicted_tokens:,} tokens "
            f"(attention recall {s.attention_recall:.3f})"
        )
    text += f"; the prefix cache served {s.prefix_hit_tokens:,} prompt tokens"
    if s.tier_hit_tokens:
        text += (
            f" and the tiers below HBM {s.tier_hit_tokens:,} more "
            f"({s.tier_load_s:.1f} s of loading)"
        )
    return text + "."


def _lead(results: Sequence[SimResult]) -> str:
    def good(r: SimResult, full: bool) -> str:
        s = r.summary
        if not full:
            return f"{r.stack}'s {s.goodput_rps:.2f} req/s ({s.slo_attainment:.1%})"
        return (
            f"{s.goodput_rps:.2f} req/s finished within the SLO ({s.slo_met:,} of "
            f"{s.requests:,} arrived, {s.slo_attainment:.1%})"
        )

    if len(results) == 1:
        return f"{results[0].stack}: goodput {good(results[0], True)}."
    ranked = sorted(results, key=lambda r: -r.summary.slo_met)
    top = [r for r in ranked if r.summary.slo_met == ranked[0].summary.slo_met]
    rest = [r for r in ranked if r not in top]
    if not rest:
        return f"{_names([r.stack for r in top], 'and')} tied on goodput: {good(top[0], True)}."
    lead = _names([r.stack for r in top], "and") + (" tied and led" if len(top) > 1 else " led")
    others = ", ".join(good(r, False) for r in rest)
    return f"{lead} on goodput: {good(top[0], True)}, against {others}."


def what_happened(results: Sequence[SimResult]) -> str:
    """One paragraph from the figures: which stack led on goodput, who was denied or
    rejected and why (per tenant), and where memory went (peak KV against the pool,
    preemptions, evictions, prefix and tier hits).

    Raises:
        ValueError: ``results`` is empty.
    """
    if not results:
        raise ValueError("'results' must hold at least one result")
    parts = [_lead(results)]
    parts += [_door(r) for r in results]
    parts += [_memory(r) for r in results]
    return " ".join(parts)
