"""kvpolicy.evict.hf.PolicyCache under a budget in bytes on the real model
(SmolLM2-135M-Instruct, offline), short: ``nox -s quality``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from kvpolicy.evict import MixedConfig, TokenPDMixed
from kvpolicy.evict.hf import PolicyCache
from kvpolicy.evict.quality import CausalLM, eval_text
from kvpolicy.evict.quality._bytes import decode_bytes

pytestmark = pytest.mark.quality

LAYERS = 30


def _generate(lm: CausalLM, cache: Any, ids: torch.Tensor, mask: torch.Tensor, new: int) -> Any:
    return lm.model.generate(
        ids,
        attention_mask=mask,
        cache=cache,
        max_new_tokens=new,
        do_sample=False,
        pad_token_id=lm.tokenizer.pad_token_id,
        return_dict_in_generate=True,
        output_logits=True,
    )


def test_mixed_policy_with_room_for_everything_is_the_full_cache(
    lm: CausalLM, chat_batch: Any
) -> None:
    """Token-PD-mixed with a budget of every fed token at 16 bits: DynamicCache's tokens,
    logits within 1e-3 (float32 rounding of the masked eager attention)."""
    ids, mask = chat_batch(lm, 120, 72)
    new = 8
    ref = _generate(lm, DynamicCache(config=lm.model.config), ids, mask, new)
    costs = PolicyCache.layer_costs(lm.model.config)
    full = (int(mask.sum()) + 2 * (new - 1)) * costs.token_bytes[16]
    mixed = MixedConfig((16, 8, 4), costs)
    cache = PolicyCache(lambda: TokenPDMixed(mixed=mixed), budget_bytes=full)
    with cache.attached(lm.model):
        out = _generate(lm, cache, ids, mask, new)
    assert out.sequences.tolist() == ref.sequences.tolist()
    diff = max(float((a - b).abs().max()) for a, b in zip(out.logits, ref.logits, strict=True))
    assert diff < 1e-3
    assert cache.demoted == 0
    assert cache.bytes_held().sum(axis=1).tolist() == [full] * LAYERS


def test_generate_holds_a_quarter_of_the_bytes_across_the_batch(
    lm: CausalLM, chat_batch: Any
) -> None:
    """Token-PD choosing 16, 8 or 4 bits or eviction per token holds each of the 30 layers
    to 25% of the full cache's bytes after every token (prompt and generated, both rows
    together); most tokens sit at 4 bits, so more tokens stay than a quarter of them; the
    answers are still text."""
    ids, mask = chat_batch(lm, 120, 72)
    new = 12
    fed = int(mask.sum()) + 2 * (new - 1)
    costs = PolicyCache.layer_costs(lm.model.config)
    budget = 0.25 * fed * costs.token_bytes[16]
    mixed = MixedConfig((16, 8, 4), costs)
    cache = PolicyCache(lambda: TokenPDMixed(mixed=mixed), budget_bytes=budget)
    with cache.attached(lm.model):
        out = _generate(lm, cache, ids, mask, new)
    held = cache.bytes_held()
    assert held.shape == (LAYERS, 2)
    assert (held.sum(axis=1) <= budget).all()
    assert 0 < cache.max_bytes <= budget
    bits = np.concatenate([cache.resident_bits(lay, r) for lay in range(LAYERS) for r in (0, 1)])
    assert bits.size == int(cache.resident().sum())
    assert set(bits.tolist()) <= {16, 8, 4}
    assert (bits == 4).mean() > 0.5
    assert cache.resident().sum(axis=1).min() > math.floor(fed / 4)
    for row in out.sequences[:, ids.shape[1] :]:
        assert len(set(row.tolist())) > 3


def test_token_by_token_is_the_harness_in_bytes_on_smollm2(lm: CausalLM) -> None:
    """32 tokens of GPL-3 fed one per forward under Token-PD-mixed (16, 8, 4 bits) at 25%
    of the full cache's bytes: the harness's byte loop (``decode_bytes``) to float
    precision, perplexity and bytes held after every step."""
    text, _ = eval_text("license")
    ids = lm.encode(text, 32)
    costs = PolicyCache.layer_costs(lm.model.config)
    budget = 0.25 * len(ids) * costs.token_bytes[16]
    mixed = MixedConfig((16, 8, 4), costs)

    def make() -> TokenPDMixed:
        return TokenPDMixed(mixed=mixed)

    (ref,) = decode_bytes(lm, ids[None], make, budget, costs)
    cache = PolicyCache(make, budget_bytes=budget)
    nll, held = [], []
    with cache.attached(lm.model), torch.no_grad():
        for t in range(len(ids) - 1):
            out = lm.model(input_ids=ids[None, t : t + 1], cache=cache, use_cache=True)
            logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            nll.append(-float(logp[ids[t + 1]]))
            held.append(float(cache.bytes_held().sum()))
    assert math.exp(float(np.mean(nll))) == pytest.approx(ref.result.perplexity, rel=1e-4)
    assert float(np.mean(held)) == pytest.approx(ref.bytes_mean, rel=1e-9)
    assert max(held) == pytest.approx(ref.bytes_max, rel=1e-9)
    assert cache.max_bytes <= budget
