"""kvpolicy.evict.hf.PolicyCache on the real model (SmolLM2-135M-Instruct, offline), short:
``nox -s quality``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from kvpolicy.evict import SinkWindowPolicy, TokenPDPolicy
from kvpolicy.evict.hf import PolicyCache
from kvpolicy.evict.quality import CausalLM, decode_perplexity, eval_text

pytestmark = pytest.mark.quality


def test_generate_matches_the_full_cache_when_nothing_is_evicted(
    lm: CausalLM, chat_batch: Any
) -> None:
    ids, mask = chat_batch(lm, 160, 96)
    gen = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": lm.tokenizer.pad_token_id}
    ref = lm.model.generate(
        ids, attention_mask=mask, cache=DynamicCache(config=lm.model.config), **gen
    )
    cache = PolicyCache(SinkWindowPolicy, 10_000)
    with cache.attached(lm.model):
        out = lm.model.generate(ids, attention_mask=mask, cache=cache, **gen)
    assert out.tolist() == ref.tolist()
    assert cache.evicted == 0


def test_generate_holds_a_quarter_of_the_cache_across_the_batch(
    lm: CausalLM, chat_batch: Any
) -> None:
    """Token-PD holds each of the 30 layers to 25% of the tokens fed, over both rows, and
    the answers are still text (not a collapse into one repeated token)."""
    ids, mask = chat_batch(lm, 160, 96)
    new = 16
    fed = int(mask.sum()) + 2 * (new - 1)
    budget = fed // 4
    gen = {"max_new_tokens": new, "do_sample": False, "pad_token_id": lm.tokenizer.pad_token_id}
    cache = PolicyCache(TokenPDPolicy, budget)
    with cache.attached(lm.model):
        out = lm.model.generate(ids, attention_mask=mask, cache=cache, **gen)
    held = cache.resident()
    assert held.shape == (30, 2)
    assert (held.sum(axis=1) <= budget).all()
    assert cache.max_resident <= budget
    assert cache.evicted == 30 * fed - int(held.sum())
    for row in out[:, ids.shape[1] :]:
        assert len(set(row.tolist())) > 3


def test_token_by_token_is_the_harness_on_smollm2(lm: CausalLM) -> None:
    """128 tokens of GPL-3 fed one per forward under Token-PD at 32 tokens: the harness's
    perplexity (``decode_perplexity``, no predictor) to float precision."""
    text, _ = eval_text("license")
    ids = lm.encode(text, 128)
    ref = decode_perplexity(lm, ids, TokenPDPolicy, 32)
    cache = PolicyCache(TokenPDPolicy, 32)
    nll = []
    with cache.attached(lm.model), torch.no_grad():
        for t in range(len(ids) - 1):
            out = lm.model(input_ids=ids[None, t : t + 1], cache=cache, use_cache=True)
            logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            nll.append(-float(logp[ids[t + 1]]))
    assert math.exp(float(np.mean(nll))) == pytest.approx(ref.perplexity, rel=1e-4)
    assert cache.max_resident == ref.max_resident
