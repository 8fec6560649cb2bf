"""kvpolicy.evict.hf.PolicyCache on the tiny random Llama (no download): ``model.generate``
under a batch-global budget, checked against transformers' own cache (kvpolicy-evict-quality's
tests check it against the harness's decode loop)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import DynamicCache

from kvpolicy.evict import SinkWindowPolicy, TokenPDPolicy
from kvpolicy.evict.hf import ATTENTION, PolicyCache


@pytest.fixture
def model(peaked_llama: Any) -> Any:
    """The 2-layer tiny Llama with peaked attention (policies then disagree)."""
    return peaked_llama


def _prompt(seed: int, n: int) -> torch.Tensor:
    return torch.randint(1, 97, (1, n), generator=torch.Generator().manual_seed(seed))


def _generate(model: Any, cache: object, ids: torch.Tensor, **kw: object) -> torch.Tensor:
    out: torch.Tensor = model.generate(ids, do_sample=False, cache=cache, **kw)
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
    def test_budget_above_everything_is_the_dynamic_cache(self, model: Any) -> None:
        ids = _prompt(1, 12)
        ref = _generate(model, DynamicCache(config=model.config), ids, max_new_tokens=10)
        cache = PolicyCache(SinkWindowPolicy, 1000)
        with cache.attached(model):
            out = _generate(model, cache, ids, max_new_tokens=10)
        assert out.tolist() == ref.tolist()
        # 12 prompt tokens and 9 generated ones were fed (the last is only returned).
        assert cache.resident().tolist() == [[21], [21]]
        assert cache.evicted == 0
        assert cache.get_seq_length() == 21

    @pytest.mark.heavy
    def test_left_padded_batch_matches_each_row_alone(self, model: Any) -> None:
        """Padding never enters the policy nor the attention: each row of a padded batch
        generates what it generates alone."""
        a, b = _prompt(2, 12), _prompt(3, 7)
        alone = [
            _generate(model, DynamicCache(config=model.config), p, max_new_tokens=8)[0, -8:]
            for p in (a, b)
        ]
        ids, mask = _padded([a, b])
        cache = PolicyCache(SinkWindowPolicy, 1000)
        with cache.attached(model):
            out = _generate(model, cache, ids, attention_mask=mask, max_new_tokens=8)
        assert out[0, -8:].tolist() == alone[0].tolist()
        assert out[1, -8:].tolist() == alone[1].tolist()
        assert cache.resident().tolist() == [[19, 14], [19, 14]]
        assert cache.resident_positions(0, 1).tolist() == list(range(14))

    @pytest.mark.heavy
    def test_batch_global_budget_holds_after_prompt_and_every_token(self, model: Any) -> None:
        """One budget over both rows: each layer holds at most 10 tokens in all, the
        policy choosing how many each row keeps."""
        ids, mask = _padded([_prompt(2, 12), _prompt(3, 7)])
        cache = PolicyCache(TokenPDPolicy, 10)
        with cache.attached(model):
            out = _generate(model, cache, ids, attention_mask=mask, max_new_tokens=8)
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

    def test_restores_the_attention_implementation(self, model: Any) -> None:
        before = model.config._attn_implementation
        cache = PolicyCache(SinkWindowPolicy, 8)
        with cache.attached(model):
            assert model.config._attn_implementation == ATTENTION
            # Another cache under the same attention gets plain eager attention.
            ids = _prompt(4, 9)
            plain = _generate(model, DynamicCache(config=model.config), ids, max_new_tokens=4)
        ref = _generate(model, DynamicCache(config=model.config), ids, max_new_tokens=4)
        assert model.config._attn_implementation == before
        assert plain.tolist() == ref.tolist()


class TestErrors:
    @pytest.mark.parametrize("budget", [0, -3, 2.5, True, "8"])
    def test_bad_budget_is_named(self, budget: object) -> None:
        with pytest.raises(ValueError, match="'budget_tokens' must be an int >= 1"):
            PolicyCache(SinkWindowPolicy, budget)  # type: ignore[arg-type]

    def test_policy_must_be_a_factory(self) -> None:
        with pytest.raises(TypeError, match="'policy' must build a policy"):
            PolicyCache(SinkWindowPolicy(), 8)  # type: ignore[arg-type]

    def test_beam_search_is_refused_clearly(self, model: Any) -> None:
        cache = PolicyCache(SinkWindowPolicy, 8)
        with (
            cache.attached(model),
            pytest.raises(NotImplementedError, match="beam search"),
        ):
            _generate(model, cache, _prompt(5, 6), max_new_tokens=3, num_beams=2)

    def test_another_batch_is_refused(self, model: Any) -> None:
        cache = PolicyCache(SinkWindowPolicy, 8)
        with cache.attached(model):
            _generate(model, cache, _prompt(5, 6), max_new_tokens=2)
            ids, mask = _padded([_prompt(6, 4), _prompt(7, 4)])
            with pytest.raises(ValueError, match="holds 1 rows, the forward passes 2"):
                _generate(model, cache, ids, attention_mask=mask, max_new_tokens=2)
