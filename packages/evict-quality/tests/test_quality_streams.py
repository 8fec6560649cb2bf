"""Per-KV-head policy streams in the decode loop (``streams="kv-head"``), on the tiny random
Llama (4 query heads, 2 KV heads; no download)."""

from __future__ import annotations

import pytest
import torch

from kvpolicy.evict.quality import (
    STREAMS,
    CausalLM,
    decode_batch,
    decode_perplexity,
    policy_factory,
)
from kvpolicy.evict.quality._runs import decode_row, decode_rows, row_key

from .test_quality import make_peaked_lm, make_tiny_lm

N = 48
BUDGET = 12


@pytest.fixture(scope="module")
def tiny_lm() -> CausalLM:
    return make_tiny_lm(2)


@pytest.fixture(scope="module")
def twin_heads_lm() -> CausalLM:
    """The tiny Llama with both KV heads (and the query heads of both groups) identical:
    every KV head sees the same attention, so per-head streams must choose as one stream."""
    lm = make_tiny_lm(2)
    with torch.no_grad():
        for layer in lm.model.model.layers:
            attn = layer.self_attn
            d = attn.head_dim
            groups = attn.num_key_value_groups
            attn.q_proj.weight[groups * d :] = attn.q_proj.weight[: groups * d].clone()
            attn.k_proj.weight[d:] = attn.k_proj.weight[:d].clone()
            attn.v_proj.weight[d:] = attn.v_proj.weight[:d].clone()
    return lm


@pytest.fixture(scope="module")
def peaked_lm() -> CausalLM:
    return make_peaked_lm(2)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 97, (N,), generator=torch.Generator().manual_seed(7))


def _make(label: str) -> object:
    factory = policy_factory(label)
    assert factory is not None
    return lambda: factory(BUDGET)


@pytest.mark.heavy
@pytest.mark.parametrize("label", ["h2o", "token-pd:keep_rule=false:memory=8", "lru"])
def test_identical_heads_equal_one_stream_per_layer(
    twin_heads_lm: CausalLM, ids: torch.Tensor, label: str
) -> None:
    by_layer = decode_perplexity(twin_heads_lm, ids, _make(label), BUDGET)  # type: ignore[arg-type]
    by_head = decode_perplexity(
        twin_heads_lm,
        ids,
        _make(label),  # type: ignore[arg-type]
        BUDGET,
        streams="kv-head",
    )
    assert by_head.perplexity == pytest.approx(by_layer.perplexity, rel=1e-6)
    assert by_head.nll == pytest.approx(by_layer.nll, rel=1e-5, abs=1e-6)
    assert by_head.mean_resident == by_layer.mean_resident


@pytest.mark.heavy
def test_attention_blind_policy_is_the_same_per_head(
    peaked_lm: CausalLM, ids: torch.Tensor
) -> None:
    """sink+window keeps the same positions whatever the attention, so per-head streams (two
    cache slices cut separately) must give the per-layer result on any weights."""
    label = "sink-window:num_sink=2"
    by_layer = decode_perplexity(peaked_lm, ids, _make(label), BUDGET)  # type: ignore[arg-type]
    by_head = decode_perplexity(peaked_lm, ids, _make(label), BUDGET, streams="kv-head")  # type: ignore[arg-type]
    assert by_head.perplexity == pytest.approx(by_layer.perplexity, rel=1e-6)
    assert by_head.max_resident == BUDGET


@pytest.mark.heavy
@pytest.mark.parametrize("label", ["h2o", "token-pd:keep_rule=false:memory=8"])
def test_heads_choose_their_own_tokens(peaked_lm: CausalLM, ids: torch.Tensor, label: str) -> None:
    """With heads that attend differently, per-head streams keep other tokens than one
    stream per layer: a different perplexity at the same budget, each head holding exactly
    the budget."""
    by_layer = decode_perplexity(peaked_lm, ids, _make(label), BUDGET)  # type: ignore[arg-type]
    by_head = decode_perplexity(peaked_lm, ids, _make(label), BUDGET, streams="kv-head")  # type: ignore[arg-type]
    assert by_head.perplexity != pytest.approx(by_layer.perplexity, rel=1e-6)
    assert by_head.max_resident == BUDGET
    assert by_head.mean_resident == by_layer.mean_resident


@pytest.mark.heavy
def test_batch_of_texts_per_head_equals_one_by_one(peaked_lm: CausalLM, ids: torch.Tensor) -> None:
    other = torch.randint(0, 97, (N,), generator=torch.Generator().manual_seed(8))
    batch = decode_batch(
        peaked_lm,
        torch.stack([ids, other]),
        _make("h2o"),  # type: ignore[arg-type]
        BUDGET,
        streams="kv-head",
    )
    for text, got in zip([ids, other], batch, strict=True):
        alone = decode_perplexity(peaked_lm, text, _make("h2o"), BUDGET, streams="kv-head")  # type: ignore[arg-type]
        assert got.perplexity == pytest.approx(alone.perplexity, rel=1e-5)


def test_unknown_streams_named(tiny_lm: CausalLM, ids: torch.Tensor) -> None:
    assert STREAMS == ("layer", "kv-head")
    with pytest.raises(ValueError, match="'streams' must be one of layer, kv-head: 'head'"):
        decode_perplexity(tiny_lm, ids, _make("h2o"), BUDGET, streams="head")  # type: ignore[arg-type]


def test_rows_record_streams_and_resume_apart(tiny_lm: CausalLM, ids: torch.Tensor) -> None:
    common = {"task": "ppl", "predictor": None, "predictor_name": "none"}
    layer = decode_row(tiny_lm, ids, text="t", policy="h2o", budget=0.25, **common)  # type: ignore[arg-type]
    head = decode_rows(
        tiny_lm,
        [ids],
        texts=["t"],
        policy="h2o",
        budget=0.25,
        streams="kv-head",
        **common,  # type: ignore[arg-type]
    )[0]
    full = decode_row(
        tiny_lm,
        ids,
        text="t",
        policy="full",
        budget=1.0,
        streams="kv-head",
        **common,  # type: ignore[arg-type]
    )
    assert (layer["streams"], head["streams"], full["streams"]) == ("layer", "kv-head", "layer")
    assert row_key(layer) != row_key(head)
    legacy = {k: v for k, v in layer.items() if k != "streams"}
    assert row_key(legacy) == row_key(layer)
