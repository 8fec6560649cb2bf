"""Fixtures of kvpolicy-evict's tests."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvpolicy.evict import (
    FIFOPolicy,
    H2OPolicy,
    LRUPolicy,
    ScoredPolicy,
    SinkWindowPolicy,
    TokenPDConfig,
    TokenPDPolicy,
)


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(0)


POLICY_FACTORIES: dict[str, Callable[[], ScoredPolicy]] = {
    "fifo": FIFOPolicy,
    "lru": LRUPolicy,
    "h2o": lambda: H2OPolicy(recent_window=3, num_sink=1),
    "sink-window": lambda: SinkWindowPolicy(num_sink=2),
    "token-pd": lambda: TokenPDPolicy(TokenPDConfig(initial_price=0.01, recent_window=2)),
    "token-pd-noprice": TokenPDPolicy,
}
"""Every token policy, in a small configuration, by a test id."""


@pytest.fixture(scope="session")
def policy_factories() -> dict[str, Callable[[], ScoredPolicy]]:
    """Factories of every token policy, by test id."""
    return POLICY_FACTORIES


@pytest.fixture(params=sorted(POLICY_FACTORIES))
def policy_name(request: pytest.FixtureRequest) -> str:
    """Each token policy's test id in turn."""
    return str(request.param)


@pytest.fixture
def any_policy(policy_name: str) -> ScoredPolicy:
    """A fresh instance of each token policy in turn."""
    return POLICY_FACTORIES[policy_name]()


@pytest.fixture(scope="module")
def peaked_llama() -> Any:
    """A 2-layer Llama with random weights (GQA: 4 query heads, 2 KV heads; vocabulary 97),
    eager attention, its queries scaled up so that its attention is peaked and differs
    between heads (policies then disagree); built here, no download (needs torch and
    transformers)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight *= 300
    model.generation_config.pad_token_id = 0
    return model
