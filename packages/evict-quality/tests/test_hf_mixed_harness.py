"""kvpolicy.evict.hf.PolicyCache under a budget in bytes against the quality harness's byte
loop (``decode_bytes``) on the tiny random Llama: fed one token per forward, the cache makes
the harness's decisions (same perplexity, same bytes after every step)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from kvpolicy.evict import (
    H2OPolicy,
    MixedConfig,
    PrecisionCosts,
    TokenPDConfig,
    TokenPDMixed,
    UniformPrecision,
)
from kvpolicy.evict.hf import PolicyCache
from kvpolicy.evict.quality import CausalLM
from kvpolicy.evict.quality._bytes import decode_bytes, layer_spec
from kvpolicy.kvmodel import EvictionPolicy

from .test_quality import make_peaked_lm

N = 40

Factory = Callable[[PrecisionCosts], Callable[[], EvictionPolicy]]

FACTORIES: dict[str, Factory] = {
    "token-pd-mixed-16-8-4": lambda c: lambda: TokenPDMixed(mixed=MixedConfig((16, 8, 4), c)),
    "token-pd-mixed-8-4-2-window": lambda c: (
        lambda: TokenPDMixed(
            TokenPDConfig(num_sink=1, recent_window=3), MixedConfig((8, 4, 2), c, loss_scale=2.0)
        )
    ),
    "h2o-int4": lambda c: lambda: UniformPrecision(H2OPolicy(recent_window=3), 4, c),
    "h2o-16": lambda c: lambda: H2OPolicy(recent_window=3),
}


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    return make_peaked_lm(2)


DEFAULT = ("token-pd-mixed-16-8-4", 0.25)

CASES = [
    pytest.param(name, share, marks=() if (name, share) == DEFAULT else pytest.mark.heavy)
    for name in sorted(FACTORIES)
    for share in (0.25, 0.5)
]
"""Every policy at 25% and 50% of the full cache's bytes; one runs by default, the others
under the ``heavy`` mark (about 4 s each on this CPU)."""


@pytest.mark.parametrize(("name", "share"), CASES)
def test_token_by_token_is_the_harness_in_bytes(lm: CausalLM, name: str, share: float) -> None:
    """The harness's perplexity to float precision, and the bytes every layer held after
    each step (mean and most over the steps, summed over the layers) exactly."""
    costs = PrecisionCosts.of(layer_spec(lm))
    assert costs == PolicyCache.layer_costs(lm.model.config)
    make = FACTORIES[name](costs)
    ids = torch.randint(0, 97, (N,), generator=torch.Generator().manual_seed(3))
    budget = share * N * costs.token_bytes[16]
    (ref,) = decode_bytes(lm, ids[None], make, budget, costs)
    cache = PolicyCache(make, budget_bytes=budget)
    nll, held = [], []
    with cache.attached(lm.model), torch.no_grad():
        for t in range(N - 1):
            out = lm.model(input_ids=ids[None, t : t + 1], cache=cache, use_cache=True)
            logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            nll.append(-float(logp[ids[t + 1]]))
            held.append(float(cache.bytes_held().sum()))
    assert math.exp(float(np.mean(nll))) == pytest.approx(ref.result.perplexity, rel=1e-5)
    assert float(np.mean(held)) == pytest.approx(ref.bytes_mean, rel=1e-12)
    assert max(held) == pytest.approx(ref.bytes_max, rel=1e-12)
    assert cache.max_bytes <= budget
    assert cache.max_resident == ref.result.max_resident
