"""kvpolicy.evict.hf.PolicyCache under a budget in bytes, on the tiny random Llama of
``conftest.peaked_llama`` (no download): mixed-precision policies (``TokenPDMixed``,
``UniformPrecision``) during ``model.generate``, the bytes held after every token, the
quantized keys and values the model reads, and the errors. kvpolicy-evict-quality's
``test_hf_mixed_harness.py`` checks it against the harness's byte loop."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from kvpolicy.evict import (
    H2OPolicy,
    MixedConfig,
    SinkWindowPolicy,
    TokenPDMixed,
    TokenPDPolicy,
    UniformPrecision,
    fake_quantize,
)
from kvpolicy.evict.hf import PolicyCache


def _prompt(seed: int, n: int) -> torch.Tensor:
    return torch.randint(1, 97, (1, n), generator=torch.Generator().manual_seed(seed))


def _padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded batch of the prompts and its attention mask."""
    width = max(r.shape[1] for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - r.shape[1] :] = r[0]
        mask[i, width - r.shape[1] :] = 1
    return ids, mask


def _generate(model: Any, cache: Any, ids: torch.Tensor, **kw: Any) -> Any:
    with torch.no_grad():
        return model.generate(
            ids,
            do_sample=False,
            cache=cache,
            return_dict_in_generate=True,
            output_logits=True,
            **kw,
        )


def _mixed(model: Any, precisions: tuple[int, ...] = (16, 8, 4)) -> MixedConfig:
    return MixedConfig(precisions=precisions, costs=PolicyCache.layer_costs(model.config))


class TestCosts:
    def test_layer_costs_are_kvmodels_for_one_layer(self, peaked_llama: Any) -> None:
        """2 KV heads of 8 channels, K and V: 64 bytes at 16 bits; below, 8 codes of ``b``
        bits per head plus one fp16 scale and zero (one group of at most 32 channels)."""
        costs = PolicyCache.layer_costs(peaked_llama.config)
        assert dict(costs.token_bytes) == {16: 64.0, 8: 48.0, 4: 32.0, 2: 24.0}
        smol = LlamaConfig(num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
        # SmolLM2-135M: 23,040 bytes per token over 30 layers at 16 bits, 7,200 at 4.
        assert PolicyCache.layer_costs(smol).token_bytes[16] * 30 == 23_040
        assert PolicyCache.layer_costs(smol).token_bytes[4] * 30 == 7_200


class TestFullPrecision:
    def test_budget_holding_everything_is_the_dynamic_cache(self, peaked_llama: Any) -> None:
        """A mixed policy whose budget holds every token at 16 bits demotes nothing: greedy
        generate gives DynamicCache's tokens and the very same logits (bit for bit)."""
        ids = _prompt(1, 12)
        ref = _generate(
            peaked_llama, DynamicCache(config=peaked_llama.config), ids, max_new_tokens=10
        )
        mixed = _mixed(peaked_llama, (16, 8, 4, 2))
        budget = 21 * mixed.costs.token_bytes[16]  # 12 prompt + 9 fed generated tokens
        cache = PolicyCache(lambda: TokenPDMixed(mixed=mixed), budget_bytes=budget)
        with cache.attached(peaked_llama):
            out = _generate(peaked_llama, cache, ids, max_new_tokens=10)
        assert out.sequences.tolist() == ref.sequences.tolist()
        assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits, strict=True))
        assert cache.demoted == 0
        assert cache.evicted == 0
        assert cache.bytes_held().tolist() == [[budget], [budget]]
        assert cache.resident_bits(1, 0).tolist() == [16] * 21


class TestMixed:
    def test_batch_global_bytes_hold_after_every_token(self, peaked_llama: Any) -> None:
        """Two left-padded rows under one budget of 60% of the full cache's bytes: every
        layer holds at most the budget after each token (the prompt's tokens included),
        over both rows; tokens sit at 8 and 4 bits (on this model's 8-channel heads a
        group's scale and zero make 4 bits the best value per byte, 8 bits the next); the
        bytes reported are those of the tokens' precisions."""
        ids, mask = _padded([_prompt(2, 12), _prompt(3, 7)])
        mixed = _mixed(peaked_llama)
        c16 = mixed.costs.token_bytes[16]
        fed = (12 + 7) + 2 * 9
        budget = 0.6 * fed * c16
        cache = PolicyCache(lambda: TokenPDMixed(mixed=mixed), budget_bytes=budget)
        with cache.attached(peaked_llama):
            out = _generate(peaked_llama, cache, ids, attention_mask=mask, max_new_tokens=10)
        assert out.sequences.shape == (2, 22)
        held = cache.bytes_held()
        assert held.shape == (2, 2)
        assert (held.sum(axis=1) <= budget).all()
        assert 0 < cache.max_bytes <= budget
        bits = set()
        for layer in range(2):
            for row in range(2):
                b = cache.resident_bits(layer, row)
                assert len(b) == cache.resident()[layer, row]
                assert held[layer, row] == pytest.approx(mixed.costs.cost(b).sum())
                bits |= set(b.tolist())
        assert bits == {8, 4}
        assert cache.demoted > 0
        # More tokens resident than 16 bits alone would allow: precision bought room.
        assert cache.resident().sum(axis=1).max() > budget // c16

    def test_demoted_tokens_hold_their_quantized_keys_and_values(self, peaked_llama: Any) -> None:
        """Under ``UniformPrecision(..., bits=4)`` with room for every token, layer 0's cached
        keys and values are exactly ``fake_quantize(x, 4)`` of DynamicCache's (layer 0's K/V
        depend only on the token and its position), and the logits move: the model reads
        the quantization error."""
        ids = _prompt(4, 10)
        mixed = _mixed(peaked_llama)
        cache = PolicyCache(
            lambda: UniformPrecision(SinkWindowPolicy(), 4, mixed.costs), budget_bytes=1e6
        )
        with cache.attached(peaked_llama):
            out = _generate(peaked_llama, cache, ids, max_new_tokens=6)
        fed = out.sequences[:, :-1]
        full = DynamicCache(config=peaked_llama.config)
        with torch.no_grad():
            ref = peaked_llama(input_ids=fed, cache=full, use_cache=True)
        layer = cache.policy_layers()[0]
        assert layer.bits == [[4] * 15]
        for held, raw in ((layer.keys, full.layers[0].keys), (layer.values, full.layers[0].values)):
            want = fake_quantize(raw.reshape(-1, raw.shape[-1]), 4).reshape(raw.shape)
            assert torch.equal(held, want)
            assert not torch.equal(held, raw)
        last = out.logits[-1][0]
        assert float((last - ref.logits[0, -1]).abs().max()) > 1e-3

    def test_a_window_keeps_the_newest_tokens_exact(self, peaked_llama: Any) -> None:
        """``UniformPrecision(..., bits=4, window=3)`` in ``model.generate``: the newest 3
        tokens of every row are held at 16 bits, DynamicCache's keys and values (up to the
        float rounding of one token's step against the whole prompt's), and every older one
        at 4 bits, ``fake_quantize`` of them."""
        ids = _prompt(4, 10)
        mixed = _mixed(peaked_llama)
        cache = PolicyCache(
            lambda: UniformPrecision(SinkWindowPolicy(), 4, mixed.costs, window=3),
            budget_bytes=1e6,
        )
        with cache.attached(peaked_llama):
            out = _generate(peaked_llama, cache, ids, max_new_tokens=6)
        fed = out.sequences[:, :-1]
        full = DynamicCache(config=peaked_llama.config)
        with torch.no_grad():
            peaked_llama(input_ids=fed, cache=full, use_cache=True)
        layer = cache.policy_layers()[0]
        assert layer.bits == [[4] * 12 + [16] * 3]
        for held, raw in ((layer.keys, full.layers[0].keys), (layer.values, full.layers[0].values)):
            old, new = raw[..., :12, :], raw[..., 12:, :]
            want = fake_quantize(old.reshape(-1, old.shape[-1]), 4).reshape(old.shape)
            assert torch.equal(held[..., :12, :], want)
            assert torch.allclose(held[..., 12:, :], new, rtol=0.0, atol=1e-6)
            coarse = fake_quantize(new.reshape(-1, new.shape[-1]), 4).reshape(new.shape)
            assert float((held[..., 12:, :] - coarse).abs().max()) > 1e-3

    def test_an_eviction_policy_in_bytes_is_the_same_in_tokens(self, peaked_llama: Any) -> None:
        """H2O under ``budget_bytes = k * (bytes of a 16-bit token)`` runs as
        ``UniformPrecision(H2O, 16)``: the same tokens and residency as ``budget_tokens=k``."""
        ids, mask = _padded([_prompt(5, 11), _prompt(6, 8)])
        costs = PolicyCache.layer_costs(peaked_llama.config)
        runs = []
        for kw in ({"budget_tokens": 9}, {"budget_bytes": 9 * costs.token_bytes[16]}):
            cache = PolicyCache(lambda: H2OPolicy(recent_window=2), **kw)  # type: ignore[arg-type]
            with cache.attached(peaked_llama):
                out = _generate(peaked_llama, cache, ids, attention_mask=mask, max_new_tokens=8)
            runs.append((out.sequences.tolist(), cache.resident().tolist(), cache))
        assert runs[0][:2] == runs[1][:2]
        assert runs[1][2].max_bytes <= 9 * costs.token_bytes[16]
        assert runs[1][2].demoted == 0
        assert runs[0][2].bytes_held().tolist() == runs[1][2].bytes_held().tolist()

    def test_a_budget_below_one_token_holds_nothing(self, peaked_llama: Any) -> None:
        """A budget smaller than one token at the lowest precision (24 bytes at 2 bits)
        evicts every token after each step, the newest included; generate still runs (each
        query attends to itself alone)."""
        ids, mask = _padded([_prompt(9, 6), _prompt(10, 4)])
        mixed = _mixed(peaked_llama, (16, 8, 4, 2))
        cache = PolicyCache(lambda: TokenPDMixed(mixed=mixed), budget_bytes=20.0)
        with cache.attached(peaked_llama):
            out = _generate(peaked_llama, cache, ids, attention_mask=mask, max_new_tokens=4)
        assert out.sequences.shape == (2, 10)
        assert cache.resident().tolist() == [[0, 0], [0, 0]]
        assert cache.max_bytes == 0.0
        assert cache.evicted == 2 * (6 + 4 + 2 * 3)

    def test_a_demoting_policy_in_tokens_only_evicts(self, peaked_llama: Any) -> None:
        """``TokenPDMixed`` under ``budget_tokens`` is Token-PD (kvmodel's DemotingPolicy
        runs wherever an eviction policy does): every token stays at 16 bits."""
        ids = _prompt(7, 12)
        outs = []
        for make in (TokenPDPolicy, lambda: TokenPDMixed(mixed=_mixed(peaked_llama))):
            cache = PolicyCache(make, budget_tokens=8)
            with cache.attached(peaked_llama):
                outs.append(_generate(peaked_llama, cache, ids, max_new_tokens=6).sequences)
            assert set(cache.resident_bits(0, 0).tolist()) == {16}
        assert outs[0].tolist() == outs[1].tolist()


class TestErrors:
    @pytest.mark.parametrize("budget", [0, -64.0, math.nan, math.inf, True, "640"])
    def test_bad_budget_bytes_is_named(self, budget: object) -> None:
        with pytest.raises(ValueError, match="'budget_bytes' must be a finite number > 0") as e:
            PolicyCache(TokenPDMixed, budget_bytes=budget)  # type: ignore[arg-type]
        assert repr(budget) in str(e.value)

    @pytest.mark.parametrize(
        ("tokens", "in_bytes"), [(None, None), (8, 512.0)], ids=["neither", "both"]
    )
    def test_one_budget(self, tokens: int | None, in_bytes: float | None) -> None:
        with pytest.raises(ValueError, match="give one budget, 'budget_tokens' or 'budget_bytes'"):
            PolicyCache(TokenPDMixed, tokens, budget_bytes=in_bytes)

    def test_bad_costs_and_group_size(self) -> None:
        with pytest.raises(TypeError, match="'costs' must be PrecisionCosts"):
            PolicyCache(TokenPDMixed, budget_bytes=512, costs={16: 64})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'group_size' must be an int >= 1: 0"):
            PolicyCache(TokenPDMixed, budget_bytes=512, group_size=0)

    def test_policy_counting_other_costs_is_refused_before_any_step(
        self, peaked_llama: Any
    ) -> None:
        """TokenPDMixed's default costs (one KV head of 128 channels) are not this model's:
        the first forward refuses it naming both, and the cache holds nothing."""
        cache = PolicyCache(TokenPDMixed, budget_bytes=640)
        with (
            cache.attached(peaked_llama),
            pytest.raises(ValueError, match=r"counts a token's bytes as \{16: 512.0"),
        ):
            _generate(peaked_llama, cache, _prompt(8, 6), max_new_tokens=2)
        assert cache.policy_layers() == []
        assert cache.bytes_held().shape == (0, 0)

    def test_layer_costs_of_a_config_without_head_dim(self) -> None:
        """Costs of a config without ``head_dim`` or ``num_key_value_heads`` come from
        ``hidden_size / heads`` and the query heads."""
        cfg = SimpleNamespace(num_attention_heads=4, hidden_size=256, num_key_value_heads=None)
        assert PolicyCache.layer_costs(cfg).token_bytes[16] == 2 * 4 * 64 * 2
        # 4 bits, groups of 64: 32 bytes of codes and one fp16 scale and zero per K and V.
        assert PolicyCache.layer_costs(cfg, group_size=64).token_bytes[4] == 2 * 4 * 36
