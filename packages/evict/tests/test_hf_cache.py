"""kvpolicy.evict.hf.PolicyCache on the tiny random Llama (no download): ``model.generate``
under a batch-global budget, checked against transformers' own cache and against the
quality harness's decode loop."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from kvpolicy.evict import H2OPolicy, SinkWindowPolicy, TokenPDConfig, TokenPDPolicy
from kvpolicy.evict.hf import ATTENTION, PolicyCache
from kvpolicy.evict.quality import CausalLM, decode_perplexity
from kvpolicy.kvmodel import EvictionPolicy

from .test_quality import make_peaked_lm

N = 48


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    """The 2-layer tiny Llama with peaked attention (policies then disagree)."""
    lm = make_peaked_lm(2)
    lm.model.generation_config.pad_token_id = 0
    return lm


def _prompt(seed: int, n: int) -> torch.Tensor:
    return torch.randint(1, 97, (1, n), generator=torch.Generator().manual_seed(seed))


def _generate(lm: CausalLM, cache: object, ids: torch.Tensor, **kw: object) -> torch.Tensor:
    out: torch.Tensor = lm.model.generate(ids, do_sample=False, cache=cache, **kw)
    return out


def _padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded batch of the prompts and its attention mask."""
    width = max(r.shape[1] for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - r.shape[1] :] = r[0]
        mask[i, width - r.shape[1] :] = 1
    return ids, mask


class TestGenerate:
    @pytest.mark.heavy
    def test_budget_above_everything_is_the_dynamic_cache(self, lm: CausalLM) -> None:
        ids = _prompt(1, 12)
        ref = _generate(lm, DynamicCache(config=lm.model.config), ids, max_new_tokens=10)
        cache = PolicyCache(SinkWindowPolicy, 1000)
        with cache.attached(lm.model):
            out = _generate(lm, cache, ids, max_new_tokens=10)
        assert out.tolist() == ref.tolist()
        # 12 prompt tokens and 9 generated ones were fed (the last is only returned).
        assert cache.resident().tolist() == [[21], [21]]
        assert cache.evicted == 0
        assert cache.get_seq_length() == 21

    @pytest.mark.heavy
    def test_left_padded_batch_matches_each_row_alone(self, lm: CausalLM) -> None:
        """Padding never enters the policy nor the attention: each row of a padded batch
        generates what it generates alone."""
        a, b = _prompt(2, 12), _prompt(3, 7)
        alone = [
            _generate(lm, DynamicCache(config=lm.model.config), p, max_new_tokens=8)[0, -8:]
            for p in (a, b)
        ]
        ids, mask = _padded([a, b])
        cache = PolicyCache(SinkWindowPolicy, 1000)
        with cache.attached(lm.model):
            out = _generate(lm, cache, ids, attention_mask=mask, max_new_tokens=8)
        assert out[0, -8:].tolist() == alone[0].tolist()
        assert out[1, -8:].tolist() == alone[1].tolist()
        assert cache.resident().tolist() == [[19, 14], [19, 14]]
        assert cache.resident_positions(0, 1).tolist() == list(range(14))

    @pytest.mark.heavy
    def test_batch_global_budget_holds_after_prompt_and_every_token(self, lm: CausalLM) -> None:
        """One budget over both rows: each layer holds at most 10 tokens in all, the
        policy choosing how many each row keeps."""
        ids, mask = _padded([_prompt(2, 12), _prompt(3, 7)])
        cache = PolicyCache(TokenPDPolicy, 10)
        with cache.attached(lm.model):
            out = _generate(lm, cache, ids, attention_mask=mask, max_new_tokens=8)
        assert out.shape == (2, 20)
        held = cache.resident()
        assert held.shape == (2, 2)
        assert (held.sum(axis=1) <= 10).all()
        assert cache.max_resident <= 10
        assert cache.evicted == 2 * (19 + 14) - int(held.sum())
        for layer in range(2):
            for row, fed in enumerate((19, 14)):
                pos = cache.resident_positions(layer, row)
                assert len(pos) == held[layer, row]
                assert ((pos >= 0) & (pos < fed)).all()
                assert len(set(pos.tolist())) == len(pos)

    def test_restores_the_attention_implementation(self, lm: CausalLM) -> None:
        before = lm.model.config._attn_implementation
        cache = PolicyCache(SinkWindowPolicy, 8)
        with cache.attached(lm.model):
            assert lm.model.config._attn_implementation == ATTENTION
            # Another cache under the same attention gets plain eager attention.
            ids = _prompt(4, 9)
            plain = _generate(lm, DynamicCache(config=lm.model.config), ids, max_new_tokens=4)
        ref = _generate(lm, DynamicCache(config=lm.model.config), ids, max_new_tokens=4)
        assert lm.model.config._attn_implementation == before
        assert plain.tolist() == ref.tolist()


FACTORIES: dict[str, Callable[[], EvictionPolicy]] = {
    "sink-window": lambda: SinkWindowPolicy(num_sink=2),
    "h2o": lambda: H2OPolicy(recent_window=3),
    "token-pd": TokenPDPolicy,
    "token-pd-window": lambda: TokenPDPolicy(TokenPDConfig(num_sink=1, recent_window=4)),
}


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


class TestErrors:
    @pytest.mark.parametrize("budget", [0, -3, 2.5, True, "8"])
    def test_bad_budget_is_named(self, budget: object) -> None:
        with pytest.raises(ValueError, match="'budget_tokens' must be an int >= 1"):
            PolicyCache(SinkWindowPolicy, budget)  # type: ignore[arg-type]

    def test_policy_must_be_a_factory(self) -> None:
        with pytest.raises(TypeError, match="'policy' must build a policy"):
            PolicyCache(SinkWindowPolicy(), 8)  # type: ignore[arg-type]

    def test_beam_search_is_refused_clearly(self, lm: CausalLM) -> None:
        cache = PolicyCache(SinkWindowPolicy, 8)
        with (
            cache.attached(lm.model),
            pytest.raises(NotImplementedError, match="beam search"),
        ):
            _generate(lm, cache, _prompt(5, 6), max_new_tokens=3, num_beams=2)

    def test_another_batch_is_refused(self, lm: CausalLM) -> None:
        cache = PolicyCache(SinkWindowPolicy, 8)
        with cache.attached(lm.model):
            _generate(lm, cache, _prompt(5, 6), max_new_tokens=2)
            ids, mask = _padded([_prompt(6, 4), _prompt(7, 4)])
            with pytest.raises(ValueError, match="holds 1 rows, the forward passes 2"):
                _generate(lm, cache, ids, attention_mask=mask, max_new_tokens=2)
