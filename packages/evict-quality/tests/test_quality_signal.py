"""What policies observe in the decode loop (``signal``): the attention weight, or each
token's share of the change in the attention output that dropping it would make
(:func:`output_share`), checked against dropping each token for real."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvpolicy.evict.quality import (
    SIGNALS,
    CausalLM,
    decode_batch,
    decode_perplexity,
    output_share,
    policy_factory,
)
from kvpolicy.evict.quality._runs import decode_row, read_rows, row_key

from .test_quality import make_peaked_lm, make_tiny_lm

N = 40
BUDGET = 10


@pytest.fixture(scope="module")
def tiny_lm() -> CausalLM:
    return make_tiny_lm(2)


@pytest.fixture(scope="module")
def peaked_lm() -> CausalLM:
    return make_peaked_lm(2)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 97, (N,), generator=torch.Generator().manual_seed(11))


def _dropped_change(weights: torch.Tensor, values: torch.Tensor) -> np.ndarray:
    """(texts, heads, kv) norm of the output change when key i alone is dropped and the
    softmax renormalised, by brute force."""
    texts, heads, kv = weights.shape
    group = heads // values.shape[1]
    out = np.zeros((texts, heads, kv))
    for r in range(texts):
        for h in range(heads):
            a = weights[r, h].double()
            v = values[r, h // group].double()
            o = a @ v
            for i in range(kv):
                keep = torch.ones(kv, dtype=torch.bool)
                keep[i] = False
                a2 = a[keep] / a[keep].sum()
                out[r, h, i] = float(torch.linalg.norm(a2 @ v[keep] - o))
    return out


class TestOutputShare:
    def test_matches_dropping_each_token(self) -> None:
        gen = torch.Generator().manual_seed(3)
        weights = torch.softmax(torch.randn(2, 6, 9, generator=gen) * 2, dim=-1)
        values = torch.randn(2, 3, 9, 5, generator=gen)
        brute = _dropped_change(weights, values)
        # One stream per KV head: the mean over that head's 2 query heads, normalised.
        per_head = brute.reshape(2, 3, 2, 9).mean(axis=2)
        want = per_head / per_head.sum(axis=-1, keepdims=True)
        got = output_share(weights, values, 3)
        assert got.shape == (2, 3, 9)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
        # One stream per layer: the mean over every query head.
        per_layer = brute.mean(axis=1, keepdims=True)
        np.testing.assert_allclose(
            output_share(weights, values, 1),
            per_layer / per_layer.sum(axis=-1, keepdims=True),
            rtol=1e-4,
            atol=1e-7,
        )

    def test_a_sink_with_a_null_value_keeps_its_weight(self) -> None:
        # Most of the weight on a key whose value is zero: dropping it rescales every
        # other key's contribution, so it must stay the most important token.
        weights = torch.tensor([[[0.9, 0.05, 0.05]]])
        values = torch.tensor([[[[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]]])
        share = output_share(weights, values, 1)[0, 0]
        assert share[0] > share[1]
        assert share[0] > share[2]
        np.testing.assert_allclose(share.sum(), 1.0)

    def test_a_value_equal_to_the_output_costs_nothing(self) -> None:
        weights = torch.tensor([[[0.5, 0.25, 0.25]]])
        values = torch.tensor([[[[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]]]])
        share = output_share(weights, values, 1)[0, 0]
        assert share[0] == pytest.approx(0.0, abs=1e-6)


class TestDecodeWithOutputSignal:
    @pytest.mark.heavy
    def test_changes_what_is_kept_not_the_full_cache(
        self, peaked_lm: CausalLM, ids: torch.Tensor
    ) -> None:
        full_a = decode_perplexity(peaked_lm, ids, None, N, signal="attention")
        full_o = decode_perplexity(peaked_lm, ids, None, N, signal="output")
        assert full_a.perplexity == full_o.perplexity
        factory = policy_factory("h2o")
        assert factory is not None
        att = decode_perplexity(peaked_lm, ids, lambda: factory(BUDGET), BUDGET)
        out = decode_perplexity(peaked_lm, ids, lambda: factory(BUDGET), BUDGET, signal="output")
        assert att.max_resident == out.max_resident == BUDGET
        assert not np.array_equal(att.nll, out.nll)

    @pytest.mark.heavy
    def test_batch_equals_one_at_a_time(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        factory = policy_factory("token-pd:keep_rule=false:memory=8")
        assert factory is not None
        other = torch.roll(ids, 5)
        one = [
            decode_perplexity(tiny_lm, x, lambda: factory(BUDGET), BUDGET, signal="output")
            for x in (ids, other)
        ]
        both = decode_batch(
            tiny_lm,
            torch.stack([ids, other]),
            lambda: factory(BUDGET),
            BUDGET,
            signal="output",
            streams="kv-head",
        )
        # kv-head streams differ from one stream per layer; the batch of per-layer runs
        # must equal the runs one at a time.
        layer_batch = decode_batch(
            tiny_lm, torch.stack([ids, other]), lambda: factory(BUDGET), BUDGET, signal="output"
        )
        for a, b in zip(one, layer_batch, strict=True):
            np.testing.assert_allclose(a.nll, b.nll, rtol=1e-5, atol=1e-6)
        assert all(r.max_resident == BUDGET for r in both)

    def test_unknown_signal_is_refused(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        with pytest.raises(ValueError, match="'signal' must be one of attention, output"):
            decode_perplexity(tiny_lm, ids, None, N, signal="keys")
        assert SIGNALS == ("attention", "output")

    def test_row_names_its_signal(self, tiny_lm: CausalLM, ids: torch.Tensor, tmp_path) -> None:
        row = decode_row(
            tiny_lm,
            ids,
            task="ppl",
            text="t",
            policy="sink-window",
            budget=0.25,
            predictor=None,
            predictor_name="none",
            signal="output",
        )
        full = decode_row(
            tiny_lm,
            ids,
            task="ppl",
            text="t",
            policy="full",
            budget=1.0,
            predictor=None,
            predictor_name="none",
            signal="output",
        )
        assert row["signal"] == "output"
        assert full["signal"] == "attention"
        legacy = {k: v for k, v in row.items() if k != "signal"}
        assert row_key(legacy) != row_key(row)
        assert row_key(legacy) == row_key({**row, "signal": "attention"})
        assert read_rows(tmp_path / "none.jsonl") == []
