"""kvpolicy-evict's ``PolicyCache`` against the harness's decode loop on the tiny random
Llama: fed one token per forward, the cache makes the harness's decisions."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from kvpolicy.evict import H2OPolicy, SinkWindowPolicy, TokenPDConfig, TokenPDPolicy
from kvpolicy.evict.hf import PolicyCache
from kvpolicy.evict.quality import CausalLM, decode_perplexity
from kvpolicy.kvmodel import EvictionPolicy

from .test_quality import make_peaked_lm

N = 48

FACTORIES: dict[str, Callable[[], EvictionPolicy]] = {
    "sink-window": lambda: SinkWindowPolicy(num_sink=2),
    "h2o": lambda: H2OPolicy(recent_window=3),
    "token-pd": TokenPDPolicy,
    "token-pd-window": lambda: TokenPDPolicy(TokenPDConfig(num_sink=1, recent_window=4)),
}


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    """The 2-layer tiny Llama with peaked attention (policies then disagree)."""
    return make_peaked_lm(2)


@pytest.mark.heavy
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_token_by_token_is_the_harness(lm: CausalLM, name: str) -> None:
    """Fed one token per forward, the cache makes the quality harness's decisions: the same
    perplexity to float precision and the same residency (the harness's policies see the
    same attention, on the same resident keys)."""
    make = FACTORIES[name]
    ids = torch.randint(0, 97, (N,), generator=torch.Generator().manual_seed(1))
    ref = decode_perplexity(lm, ids, make, 16)
    cache = PolicyCache(make, 16)
    nll = []
    with cache.attached(lm.model), torch.no_grad():
        for t in range(N - 1):
            out = lm.model(input_ids=ids[None, t : t + 1], cache=cache, use_cache=True)
            logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            nll.append(-float(logp[ids[t + 1]]))
    assert math.exp(float(np.mean(nll))) == pytest.approx(ref.perplexity, rel=1e-5)
    assert cache.max_resident == ref.max_resident
